# tests/lib/common.sh — shared preamble for the tests/test_*.sh scripts: argument handling, a temp dir
# removed on exit, ok/fail counters and the closing tally, and the openai-SDK virtualenv.
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

# ensure_openai_venv <venv-dir> <warning>: sets PY to a python with the `openai` and `anthropic` SDKs (the
# venv, made and filled from PyPI once), else to python3 after printing <warning> on stderr.
ensure_openai_venv() {
    local venv=$1 warning=$2
    PY=python3
    if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai, anthropic" 2>/dev/null; then
        PY="$venv/bin/python"
    elif { [ -x "$venv/bin/pip" ] || python3 -m venv "$venv" >/dev/null 2>&1; } &&
        "$venv/bin/pip" install -q openai anthropic >/dev/null 2>&1; then
        PY="$venv/bin/python"
    else
        echo "$warning" >&2
    fi
}
