# tests/lib/common.sh — shared preamble for the tests/test_*.sh scripts: argument handling, a temp dir
# removed on exit, ok/fail counters and the closing tally, and the one Python the tests use (lily_python).
# Sourced, never run (CTest runs only tests/test_*.sh).

# lily_test_init <path-to-lily> <tests/data>: sets LILY, DATA, TMP (removed on exit), passes=0, fails=0.
lily_test_init() {
    LILY=$1
    DATA=$2
    TMP=$(mktemp -d)
    trap 'rm -rf "$TMP"' EXIT
    fails=0
    passes=0
}

ok() { echo "ok   $1"; passes=$((passes + 1)); }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }
expect() { # name, condition-command...
    local name=$1; shift
    if "$@"; then ok "$name"; else fail "$name"; fi
}

# finish: prints the tally; its status (the script's last command) is 0 only when nothing failed.
finish() {
    echo "$passes passed, $fails failed"
    [ "$fails" = 0 ]
}

# lily_python LILY [PACKAGE...]: sets PY to the test suite's one Python: the virtualenv BUILD/venv next to
# the lily binary, made once (under a lock: CTest runs scripts in parallel) from the Debian interpreter
# /usr/bin/python3 with its site packages visible (python3-numpy from `make deps`), never from whatever
# python3 comes first on PATH (a pyenv shim without numpy, say). Where /usr/bin/python3 is missing (macOS)
# the first python3 on PATH seeds it instead. numpy is installed from PyPI into the venv when the seed
# interpreter lacks it; each PACKAGE (e.g. openai, or websocket-client=websocket: the PyPI name, then the
# module to import when it differs) is installed from PyPI once. A package that cannot be
# installed (no network) leaves PY_MISSING naming it, with a warning on stderr: callers skip what needs it.
lily_python() {
    local lily=$1; shift
    local venv base
    venv="$(cd "$(dirname "$lily")" && pwd)/venv"
    base=/usr/bin/python3
    [ -x "$base" ] || base=$(command -v python3)
    PY_MISSING=""
    (
        flock 9
        if [ ! -x "$venv/bin/python" ]; then
            "$base" -m venv --system-site-packages "$venv" >/dev/null 2>&1 \
                || { echo "lily tests: cannot make a virtualenv with $base -m venv" >&2; exit 1; }
        fi
        local want=() pkg
        "$venv/bin/python" -c "import numpy" 2>/dev/null || want+=(numpy)
        for pkg in "$@"; do
            "$venv/bin/python" -c "import ${pkg#*=}" 2>/dev/null || want+=("${pkg%%=*}")
        done
        if [ ${#want[@]} -gt 0 ]; then
            "$venv/bin/python" -m pip install -q "${want[@]}" >/dev/null 2>&1 \
                || echo "lily tests: WARNING: cannot install ${want[*]} from PyPI (no network?)" >&2
        fi
    ) 9>"$venv.lock"
    PY="$venv/bin/python"
    [ -x "$PY" ] || PY=$base
    local pkg
    for pkg in numpy "$@"; do
        "$PY" -c "import ${pkg#*=}" 2>/dev/null || PY_MISSING="$PY_MISSING ${pkg%%=*}"
    done
}
