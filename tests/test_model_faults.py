"""test_model_faults.py — run by test_model_faults.sh; see there.

usage: python3 test_model_faults.py <lily-binary> <tiny-chat dir>
Raw HTTP only (urllib): no package beyond the standard library.
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

LILY, MODEL = sys.argv[1], sys.argv[2]
TMP = tempfile.mkdtemp(prefix="lily-model-faults-")
failures = []


def check(cond, what, detail=""):
    print(("  ok   " if cond else "  FAIL ") + what + ("" if cond else f"  [{detail}]"))
    if not cond:
        failures.append(what)


def copy_model(name):
    d = os.path.join(TMP, name)
    shutil.copytree(MODEL, d)
    return d


def edit_json(path, fn):
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(fn(text))


def set_tensor(model_dir, name, value16):
    """Every BF16 element of tensor `name` := the bit pattern value16."""
    path = os.path.join(model_dir, "model.safetensors")
    buf = bytearray(open(path, "rb").read())
    h = struct.unpack("<Q", buf[:8])[0]
    t = json.loads(buf[8:8 + h])[name]
    assert t["dtype"] == "BF16"
    b, e = t["data_offsets"]
    buf[8 + h + b:8 + h + e] = struct.pack("<H", value16) * ((e - b) // 2)
    open(path, "wb").write(bytes(buf))


def run(model_dir, *extra, raw=True):
    p = subprocess.run([LILY, "run", "-m", model_dir] + (["--raw"] if raw else []) +
                       ["-p", "The", "-n", "8", "--temp", "0", "-t", "1", *extra],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


class Server:
    def __init__(self, model_dir):
        self.log = open(os.path.join(TMP, "serve.log"), "w+")
        self.proc = subprocess.Popen([LILY, "serve", "-m", model_dir, "--port", "0", "--ctx-size", "1024",
                                      "--threads", "1"], stdout=subprocess.DEVNULL, stderr=self.log)
        port, deadline = None, time.time() + 60
        while port is None and time.time() < deadline and self.proc.poll() is None:
            time.sleep(0.05)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(self.log.name).read())
            port = int(m.group(1)) if m else None
        if port is None:
            sys.exit("lily serve did not start:\n" + open(self.log.name).read())
        self.base = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                if urllib.request.urlopen(self.base + "/health", timeout=5).status == 200:
                    break
            except Exception:
                time.sleep(0.1)

    def post(self, path, body):
        """(status, text) of a POST with the raw JSON text body."""
        req = urllib.request.Request(self.base + path, body.encode(), {"Content-Type": "application/json"})
        try:
            r = urllib.request.urlopen(req, timeout=120)
            return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


CHAT = '{"messages":[{"role":"user","content":"Hello there"}],"max_tokens":8%s}'

print("NaN weights: refused at load, naming the tensor")
d = copy_model("nan")
set_tensor(d, "language_model.lm_head.scales", 0x7FC0)
rc, out, err = run(d)
check(rc != 0 and "language_model.lm_head.scales" in err and "not finite" in err, "lily run refuses NaN scales", err)
check(err.startswith(f"lily run: {d}: language_model.lm_head.scales"),
      "... naming the model directory first, as config.json and shard errors do (as lily info does)", err)

print("finite weights that overflow: non-finite logits are an error, never an empty success")
d = copy_model("overflow")
set_tensor(d, "language_model.model.norm.weight", 0x7F7F)  # the largest finite bf16, ~3.4e38
rc, out, err = run(d)
check(rc != 0 and "non-finite logit" in err, "lily run fails on non-finite logits", err)
srv = Server(d)
try:
    status, text = srv.post("/v1/chat/completions", CHAT % "")
    check(status == 500 and "non-finite logit" in text, "non-streaming chat: 500 naming the cause", f"{status} {text}")
    status, text = srv.post("/v1/completions", '{"prompt":"The","max_tokens":4}')
    check(status == 500 and "non-finite logit" in text, "completion: 500", f"{status} {text}")
    status, text = srv.post("/v1/chat/completions", CHAT % ',"stream":true')
    check("non-finite logit" in text and "[DONE]" not in text and '"finish_reason":"stop"' not in text,
          "streaming chat: an error event, no finish", text)
finally:
    srv.stop()

print("a data section at any byte offset: MLX writes the safetensors header unpadded")
for prec in ("fast", "exact"):
    rc_ref, out_ref, err_ref = run(MODEL, "--precision", prec)
    for past in (1, 2, 3, 6):  # bytes past an 8-byte boundary where the data section starts
        d = copy_model(f"unaligned-{prec}-{past}")
        path = os.path.join(d, "model.safetensors")
        buf = open(path, "rb").read()
        h = struct.unpack("<Q", buf[:8])[0]
        header = buf[8:8 + h].rstrip(b" ")
        header += b" " * ((past - 8 - len(header)) % 8)  # trailing whitespace in the header is allowed
        open(path, "wb").write(struct.pack("<Q", len(header)) + header + buf[8 + h:])
        rc, out, err = run(d, "--precision", prec)
        check(rc == 0 and rc_ref == 0 and out == out_ref and "runtime error" not in err,
              f"{prec}: a data section {past} bytes past an 8-byte boundary gives the same reply", err[-600:])
        shutil.rmtree(d)

print("out-of-range integers in model files")
d = copy_model("bigints")
edit_json(os.path.join(d, "tokenizer_config.json"),
          lambda t: t.replace('"model_max_length": 8192', '"model_max_length": 1000000000000000019884624838656'))
edit_json(os.path.join(d, "config.json"), lambda t: t.replace('"model_type"', '"huge": -99999999999999999999999, "model_type"', 1))
edit_json(os.path.join(d, "generation_config.json"), lambda t: t.replace("{", '{"max_length": 1e400, "big": 18446744073709551616, "huger": -' + "9" * 400 + ',', 1))
rc_ref, out_ref, err_ref = run(MODEL)
rc, out, err = run(d)
check(rc == 0 and rc_ref == 0 and out == out_ref, "MLX-LM's model_max_length and other huge integers load", err)
rc, out, err = run(d, "--system", "x", raw=False)  # the chat template (--raw would render none)
check(rc == 0, "chat rendering reads the same tokenizer_config.json", err)

d = copy_model("eos")
edit_json(os.path.join(d, "config.json"), lambda t: re.sub(r'"eos_token_id": *\d+', '"eos_token_id": 512', t, count=1))
rc, out, err = run(d)
check(rc != 0 and "eos_token_id" in err and "512 is outside the vocabulary (vocab_size 512)" in err,
      "an eos_token_id beyond the vocabulary is refused", err)
d = copy_model("eos-gen")
with open(os.path.join(d, "generation_config.json"), "w") as f:
    f.write('{"eos_token_id": [2, 4096]}')
rc, out, err = run(d)
check(rc != 0 and "generation_config.json" in err and "4096 is outside the vocabulary" in err,
      "generation_config.json's eos_token_id too", err)

print("generation_config.json: sampling fields checked at load, the penalties honoured by run as by serve")
for field, value, said in (("temperature", "-5", "'temperature' must be a number >= 0, found -5"),
                           ("top_p", "7", "'top_p' must be a number in (0, 1], found 7"),
                           ("min_p", '"high"', "'min_p' must be a number in [0, 1], found string"),
                           ("repetition_penalty", "0", "'repetition_penalty' must be a number > 0, found 0"),
                           ("top_k", "1.5", "'top_k' must be an integer (0 = off), found number"),
                           ("max_new_tokens", "-1", "'max_new_tokens' must be an integer in [1, 2147483647]"),
                           ("do_sample", '"yes"', "'do_sample' must be true or false, found string")):
    d = copy_model("gen-" + field)
    edit_json(os.path.join(d, "generation_config.json"), lambda t: json.dumps({**json.loads(t), field: json.loads(value)}))
    rc, out, err = run(d)
    check(rc == 1 and err.count("\n") == 1 and f"{d}: generation_config.json: {said}" in err and out == "",
          f"generation_config.json {field} {value}: run exits 1 naming the file and field", err)
p = subprocess.run([LILY, "serve", "-m", d, "--port", "0"], capture_output=True, text=True, timeout=60)
check(p.returncode == 1 and "generation_config.json: 'do_sample'" in p.stderr,
      "serve refuses it at load (not a 400 on every request)", p.stderr)
d = copy_model("gen-loop")
os.remove(os.path.join(d, "generation_config.json"))
os.symlink("generation_config.json", os.path.join(d, "generation_config.json"))
rc, out, err = run(d)
check(rc == 1 and "generation_config.json: cannot open" in err,
      "a generation_config.json that exists but cannot be opened is an error, not a missing file", err)
for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
             "chat_template.jinja", "model.safetensors"):
    # a FIFO blocks whoever opens it until a writer comes: the loader must refuse it without opening it
    d = copy_model("fifo-" + name)
    os.remove(os.path.join(d, name))
    os.mkfifo(os.path.join(d, name))
    try:
        p = subprocess.run([LILY, "run", "-m", d, "-p", "The", "-n", "1", "-t", "1"],
                           capture_output=True, text=True, timeout=30)
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = None, "hung (killed after 30 s)"
    check(rc == 1 and f"{name}: not a regular file (a FIFO)" in err,
          f"a FIFO named {name} is refused with a clear error, not a hang", err)
    shutil.rmtree(d, ignore_errors=True)
d = copy_model("gen-presence")
edit_json(os.path.join(d, "generation_config.json"), lambda t: t.replace("{", '{"presence_penalty": 100,', 1))
ids = lambda e: re.search(r"generated ids: ([\d ]+)", e).group(1).split()
_, _, err_plain = run(MODEL, "-n", "60", "--show-ids")
rc, _, err_pen = run(d, "-n", "60", "--show-ids")
check(rc == 0 and len(set(ids(err_plain))) < 60 and len(set(ids(err_pen))) == 60,
      "run takes presence_penalty from generation_config.json, as serve does: 60 distinct ids greedy "
      f"({len(set(ids(err_pen)))}; {len(set(ids(err_plain)))} without)", err_pen)

d = copy_model("added")
tok = json.load(open(os.path.join(d, "tokenizer.json")))
tok["added_tokens"].append(dict(tok["added_tokens"][-1], id=2**31 - 1, content="<|big|>"))
json.dump(tok, open(os.path.join(d, "tokenizer.json"), "w"))
rc, out, err = run(d)
check(rc != 0 and "id 2147483647 is larger than" in err and "needs an" not in err,
      "an added token id of 2^31-1 gets a message about its size", err)

print("requests: top_p 0, seeds outside int64; the prefix cache's default cap")
srv = Server(MODEL)
try:
    # tiny-chat at --ctx-size 1024: one full-context state is ~1 MiB, so 4 of them fall under the 64 MiB floor
    log = open(srv.log.name).read()
    check("prefix cache: up to 64 MiB of host memory (4 full-context states of" in log,
          "the startup log says the cap sized from the model", log)
    metrics = urllib.request.urlopen(srv.base + "/metrics", timeout=10).read().decode()
    check(f"lily_prefix_cache_capacity_bytes {64 << 20}" in metrics, "/metrics reports that cap",
          [l for l in metrics.splitlines() if "capacity" in l])
    s0, t0 = srv.post("/v1/chat/completions", CHAT % ',"temperature":0')
    s1, t1 = srv.post("/v1/chat/completions", CHAT % ',"temperature":1,"top_p":0')
    c0 = json.loads(t0)["choices"][0]["message"] if s0 == 200 else None
    c1 = json.loads(t1)["choices"][0]["message"] if s1 == 200 else None
    check(s1 == 200 and c0 == c1, "top_p 0 is greedy", f"{s1} {t1[:300]}")
    for seed in ("9223372036854775807", "-9223372036854775808"):
        s, t = srv.post("/v1/chat/completions", CHAT % f',"seed":{seed},"temperature":1')
        check(s == 200, f"seed {seed} is accepted", f"{s} {t[:300]}")
    # outside int64 (OpenAI's range): a 400 naming seed, also where the nearest double is a bound (2^64)
    for seed in ("9223372036854775808", "18446744073709551615", "18446744073709551617", "-9223372036854775809",
                 "100000000000000000000000"):
        s, t = srv.post("/v1/chat/completions", CHAT % f',"seed":{seed}')
        check(s == 400 and json.loads(t)["error"]["param"] == "seed" and "unparseable" not in t.lower(),
              f"seed {seed} is a 400 naming seed", f"{s} {t[:300]}")
    s, t = srv.post("/v1/chat/completions", '{"messages":[{"role":"user","content":"x"}],"max_tokens":99999999999999999999}')
    check(s == 400 and json.loads(t)["error"]["param"] == "max_tokens", "max_tokens 1e20 is a 400 naming max_tokens",
          f"{s} {t[:300]}")
    s, t = srv.post("/v1/chat/completions", CHAT % ',"ignored":[123456789012345678901234567890]')
    check(s == 200, "an ignored huge integer does not fail the request", f"{s} {t[:300]}")
finally:
    srv.stop()

shutil.rmtree(TMP, ignore_errors=True)
print(f"{len(failures)} failed")
sys.exit(1 if failures else 0)
