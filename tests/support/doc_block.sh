# Sourced by the checks that run the documentation's command blocks as a
# reader pastes them (tests/readme, tests/hooks/codex.sh).
#
# doc_block FILE HEADING [N]: the Nth (default: first) bash block after the
# first line of FILE that starts with HEADING, without its fences. A block
# may be indented (inside a numbered step); its lines keep their indent.
doc_block() {
  awk -v h="$2" -v n="${3:-1}" '
    index($0, h) == 1 {f=1}
    f && /^ *```bash$/ {k++; if (k==n) {b=1}; next}
    b && /^ *```/ {exit}
    b' "$1"
}
