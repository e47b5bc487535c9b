#!/bin/bash -eu
# OSS-Fuzz build script (https://google.github.io/oss-fuzz/): builds every
# fuzz target of fuzz/meson.build with the infrastructure's compiler, flags
# and engine, and puts in $OUT what it expects for each target T:
#   fuzz-T                    the target (LLVMFuzzerTestOneInput, unchanged)
#   fuzz-T_seed_corpus.zip    fuzz/corpus/T/ and tests/fuzz/regressions/T/
#   fuzz-T.dict               fuzz/T.dict, where there is one
#   fuzz-T.options            fuzz/T.options (max_len), where there is one
#
# Inputs (OSS-Fuzz sets them): CC, CFLAGS (sanitizer and coverage flags),
# LIB_FUZZING_ENGINE (the engine's link arguments), OUT, SRC (the checkout is
# $SRC/forkbox), WORK (scratch). forkbox's own sources are built from source;
# the libraries it uses (libseccomp, cJSON, libarchive, zlib, nettle, ...)
# are the distribution's (fuzz/oss-fuzz/Dockerfile installs them). Locally:
#   CC=clang-14 CFLAGS=-fsanitize=fuzzer-no-link,address \
#   LIB_FUZZING_ENGINE=-fsanitize=fuzzer OUT=/tmp/out fuzz/oss-fuzz/build.sh
# (tests/fuzz/oss-fuzz-test does that and runs one target). FUZZ_TARGETS
# (space-separated names) builds only those.

src=${SRC:-$(cd "$(dirname "$0")/../../.." && pwd)}
repo=$src/forkbox
[ -f "$repo/fuzz/meson.build" ] || repo=$(cd "$(dirname "$0")/../.." && pwd)
work=${WORK:-$(mktemp -d)}
build=$work/forkbox-build
mkdir -p "$OUT"

# Every target fuzz/meson.build knows (as tools/fuzz reads them).
# Not the -sm variants (libFuzzer's custom mutator API; the engine is the
# infrastructure's choice) nor frame-diff (its oracle is Python read from the
# source tree at run time, and it embeds libpython3.11: neither is in $OUT).
targets=${FUZZ_TARGETS:-$(sed -n "s/^  '\([a-z0-9_-]*\)': \[.*/\1/p" "$repo/fuzz/meson.build" |
    grep -v -e '-sm$' -e '^frame-diff$')}

# meson builds only what the targets link. CFLAGS go to the link too (the
# sanitizer runtimes); the engine is a meson option because it may be a
# library path (libFuzzingEngine.a) rather than -fsanitize=fuzzer.
rm -rf "$build"
CC="$CC" meson setup "$build" "$repo" -Dfuzzing=true -Db_lundef=false \
    -Dfuzzing_engine="$LIB_FUZZING_ENGINE" \
    -Dc_args="$CFLAGS" -Dc_link_args="$CFLAGS ${LDFLAGS:-}" >/dev/null
ninja -C "$build" $(printf 'fuzz/fuzz-%s ' $targets)

for t in $targets; do
    cp "$build/fuzz/fuzz-$t" "$OUT/"
    rm -f "$OUT/fuzz-${t}_seed_corpus.zip"
    seeds=$(find "$repo/fuzz/corpus/$t" "$repo/tests/fuzz/regressions/$t" -maxdepth 1 -type f 2>/dev/null || true)
    # zip -j: OSS-Fuzz's images have it; python3 -m zipfile where not.
    if [ -n "$seeds" ]; then
        if command -v zip >/dev/null; then
            zip -q -j "$OUT/fuzz-${t}_seed_corpus.zip" $seeds
        else
            python3 -m zipfile -c "$OUT/fuzz-${t}_seed_corpus.zip" $seeds
        fi
    fi
    for f in "$repo/fuzz/$t.dict" "$repo/fuzz/$t.options"; do
        if [ -f "$f" ]; then
            cp "$f" "$OUT/fuzz-${f##*/}"
        fi
    done
done
