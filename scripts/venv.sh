# Sourced by scripts/test and scripts/up: finds Python >= 3.11, creates .venv when missing and
# installs Biplane with its test extra once (again when pyproject.toml changes).
# The caller sets TOOL (its name, for messages) and runs from the checkout root.

# A candidate counts only if it runs and is new enough (pyenv shims exist for versions not installed).
new_enough() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1; }

ensure_venv() {
  local python="${PYTHON:-}" candidate
  if [ -z "$python" ]; then
    for candidate in python3 python3.13 python3.12 python3.11; do
      if command -v "$candidate" >/dev/null 2>&1 && new_enough "$candidate"; then python="$candidate"; break; fi
    done
  fi
  if [ -z "$python" ] || ! new_enough "$python"; then
    echo "$TOOL: Biplane needs Python >= 3.11 (found: ${python:-none}). Install it, or set PYTHON=/path/to/python3.11." >&2
    exit 2
  fi
  if [ ! -x .venv/bin/python ]; then
    echo "$TOOL: creating .venv with $python" >&2
    "$python" -m venv .venv
  fi
  local stamp=.venv/.biplane-installed log=.venv/install.log
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "$TOOL: installing Biplane and its test extra into .venv (once; takes a minute; log in $log)" >&2
    # pip's build backend is chatty even with --quiet: keep its output unless the install fails.
    if ! { .venv/bin/python -m pip install --quiet --upgrade pip && .venv/bin/python -m pip install --quiet -e '.[test]'; } >"$log" 2>&1; then
      tail -n 40 "$log" >&2
      echo "$TOOL: installing into .venv failed; the whole log is $log" >&2
      exit 1
    fi
    touch "$stamp"
  fi
}
