# shellcheck shell=bash
# The CLI tests' shared part, sourced by each (before it leaves the folder it
# was started in): a scratch folder to work in, and how a check reports.
# Each check prints "ok   NAME" or "FAIL NAME: why" and counts the failures;
# `finish` ends the test, failing when any check did.

# cli_scratch NAME: a new folder under $TMPDIR, made the working directory
# and removed at exit (made writable first: some tests take the write
# permission away).
cli_scratch() {
  TMP=$(mktemp -d "${TMPDIR:-/tmp}/pooch-$1.XXXXXX")
  trap 'chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT
  cd "$TMP" || exit 1
}

failures=0
pass() { echo "ok   $1"; }
fail() {
  echo "FAIL $1"
  failures=$((failures + 1))
}

# expect NAME WANT_RC CMD...: runs CMD (stdout > NAME.out, stderr > NAME.err)
# and checks its exit status; on a failure shows the ends of both.
expect() {
  local name=$1 want=$2
  shift 2
  "$@" > "$name.out" 2> "$name.err"
  local rc=$?
  if [ "$rc" = "$want" ]; then
    pass "$name (exit $rc)"
    return 0
  fi
  fail "$name: exit $rc, wanted $want"
  sed 's/^/    | /' "$name.err" | tail -5
  sed 's/^/    | /' "$name.out" | tail -5
  return 1
}

# contains NAME FILE PATTERN: FILE has a line matching PATTERN (an extended
# regular expression).
contains() {
  if grep -Eq -- "$3" "$2"; then pass "$1"; else
    fail "$1: '$3' not in $2"
    sed 's/^/    | /' "$2" | tail -5
  fi
}

finish() {
  if [ "$failures" -gt 0 ]; then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all checks passed"
}
