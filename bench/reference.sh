#!/usr/bin/env bash
# bench/reference.sh: this checkout's broker against a reference build,
# alternating (`loopx-bench --reference`), so that a drift of the durable
# path across many commits is seen (issue 29: round 2 made each cycle hand
# write() a quarter more bytes, and A/Bs of neighbouring commits missed it).
#
#   bench/reference.sh [--debug] [--commit C] [loopx-bench flags...]
#
# The reference (default: 5049412, round 1's build) is checked out in a git
# worktree under the target dir and built into the same target dir, so only
# the crates that differ compile; it is built with this checkout's cargo
# configuration (.cargo/config.toml: the same SQLite build options), so the
# comparison is of the code. Both binaries are copied to
# target/reference/<name>/loopx. Release by default; --debug for CI's smoke,
# whose figures are only a sign of direction. Flags after those go to
# loopx-bench (e.g. --quick, --rounds 3). Exits 0 with a message when the
# reference commit is not in this checkout's history (a shallow clone).
set -euo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
commit=5049412
profile=release
while [ $# -gt 0 ]; do
    case "$1" in
        --debug) profile=debug; shift ;;
        --commit) commit=$2; shift 2 ;;
        *) break ;;
    esac
done
if ! git cat-file -e "$commit^{commit}" 2>/dev/null \
    || ! git merge-base --is-ancestor "$commit" HEAD; then
    echo "bench/reference.sh: skipped: the reference commit $commit is not in this checkout's history (a shallow clone?)"
    exit 0
fi
cargo_profile=()
[ "$profile" = release ] && cargo_profile=(--release)
target=${CARGO_TARGET_DIR:-$root/target}
out=$target/reference
ref_name=$(git rev-parse --short=7 "$commit")
head_name="HEAD-$(git rev-parse --short=7 HEAD)"
if ! git diff --quiet HEAD -- src migrations Cargo.toml Cargo.lock .cargo; then
    head_name="$head_name-dirty"
fi

# Today's broker and the bench, then the broker's copy (the reference's
# build below writes the same target/<profile>/loopx).
# (Two builds, as CI's earlier steps make them: built together, the two
# packages' dependencies would unify features differently and recompile.)
# Once a reference was built into this target dir, cargo may take the
# broker for fresh when it is not: both builds are the same package to it
# (same name, version and flags), so the reference's fingerprint answers
# for this checkout's sources, and `target/<profile>/loopx` would be the
# reference's binary under HEAD's name (seen: a build of HEAD "finished" in
# 0.5 s, byte for byte the reference). So the broker's own artifacts go
# first; its dependencies stay built.
if [ -e "$out/src/.git" ]; then
    cargo clean --quiet --profile "$([ "$profile" = release ] && echo release || echo dev)" -p loopx
fi
cargo build --locked "${cargo_profile[@]}" --bin loopx
cargo build --locked "${cargo_profile[@]}" -p loopx-bench
mkdir -p "$out/$head_name" "$out/$ref_name"
# (rm first: target/<profile>/loopx is a hard link to cargo's own copy.)
rm -f "$out/$head_name/loopx" "$out/$ref_name/loopx"
cp "$target/$profile/loopx" "$out/$head_name/loopx"

# The reference, from a worktree of its own (made once, re-pointed after).
src=$out/src
if [ ! -e "$src/.git" ]; then
    rm -rf "$src"
    git worktree prune
    git worktree add --force --detach "$src" "$commit" >/dev/null
else
    git -C "$src" checkout --quiet --detach "$commit"
fi
# Run from this checkout, so its cargo configuration applies.
cargo build --locked "${cargo_profile[@]}" --manifest-path "$src/Cargo.toml" \
    --target-dir "$target" -p loopx --bin loopx
cp "$target/$profile/loopx" "$out/$ref_name/loopx"
if [ "$head_name" != "$ref_name" ] && [ "$(git rev-parse "$commit^{tree}")" != "$(git rev-parse "HEAD^{tree}")" ] \
    && cmp -s "$out/$head_name/loopx" "$out/$ref_name/loopx"; then
    echo "bench/reference.sh: HEAD's broker and the reference's are the same file; cargo reused one build for both" >&2
    exit 1
fi
# Put this checkout's broker back where cargo and the tests expect it.
rm -f "$target/$profile/loopx"
cp "$out/$head_name/loopx" "$target/$profile/loopx"

"$target/$profile/loopx-bench" --loopx "$out/$head_name/loopx" \
    --reference "$out/$ref_name/loopx" "$@"
