#!/usr/bin/env bash
# Build llama-cpp-python portably, once per machine, and install it into the Python that
# runs this (the active venv; $PYTHON to choose another):
#
#     scripts/install_llama_cpp.sh            # then: pip install -e '.[local]'
#
# Why: pip compiles llama-cpp-python from source, and llama.cpp's CMake default is
# GGML_NATIVE=ON (-march=native): the library uses every instruction of the machine that
# built it (AVX-512, AMX …) and dies with SIGILL on a CPU without them, or, as in issue
# 18, in a code path (AMX repacking) the build machine's OS or hypervisor does not run.
# And pip's wheel cache keys a built wheel by the sdist's URL, not by CMAKE_ARGS: a
# native wheel built once is handed back to every later install, whatever flags are set.
#
# What: llama.cpp for x86-64-v3 (SSE4.2, AVX, AVX2, FMA, F16C, BMI2: every x86-64 CPU
# since Haswell (2013) and Zen (2017)), no AVX-512, no AMX; on other machines just
# GGML_NATIVE=OFF (the baseline of that architecture). The wheel is built with
# --no-cache-dir (pip's cache is neither read nor written), kept in a folder named by
# the version, the flags, the Python and the machine, and installed from there: the next
# run (a new venv, CI) finds it and compiles nothing.
#
# llama.cpp can also build every CPU variant and pick one at run time
# (GGML_CPU_ALL_VARIANTS with GGML_BACKEND_DL), but llama-cpp-python 0.3.x never loads
# such backends (it does not call ggml_backend_load_all), it would compile the CPU code
# a dozen times (too long for CI on 2 cores), and one of those variants is the AMX one.
set -euo pipefail

VERSION=${LLAMA_CPP_VERSION:-0.3.36}  # the version navi's tests run on
PY=${PYTHON:-python}
case "$(uname -m)" in
    x86_64 | amd64)
        FLAGS="-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON"
        FLAGS+=" -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF"
        FLAGS+=" -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
        ;;
    *) FLAGS="-DGGML_NATIVE=OFF" ;;
esac
where=$("$PY" -c 'import platform, sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")')
key=$("$PY" -c 'import hashlib, sys; print(hashlib.sha256(sys.argv[1].encode()).hexdigest()[:12])' \
      "$VERSION $FLAGS $where")
CACHE=${NAVI_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/navi/wheels}/llama-cpp-python-$VERSION-$where-$key

wheel() { compgen -G "$CACHE/llama_cpp_python-$VERSION-*.whl" | head -n 1; }

if [ -z "$(wheel)" ]; then
    echo "compiling llama-cpp-python $VERSION with CMAKE_ARGS=\"$FLAGS\""
    echo "  (once per machine: about 5 minutes on 2 cores) into $CACHE"
    build=$(mktemp -d)
    trap 'rm -rf "$build"' EXIT
    CMAKE_ARGS="$FLAGS" "$PY" -m pip wheel -q --no-cache-dir --no-deps \
        --no-binary llama-cpp-python -w "$build" "llama-cpp-python==$VERSION"
    mkdir -p "$CACHE"
    printf '%s\n' "$FLAGS" > "$build/CMAKE_ARGS"
    mv "$build"/llama_cpp_python-*.whl "$build/CMAKE_ARGS" "$CACHE"/
fi
echo "installing $(wheel) (built with: $(cat "$CACHE/CMAKE_ARGS" 2>/dev/null || echo "$FLAGS"))"
# The file itself, not a name pip could resolve elsewhere, even over a llama-cpp-python
# of the same version already there (a native one); then its dependencies and [server].
"$PY" -m pip install -q --force-reinstall --no-deps "$(wheel)"
"$PY" -m pip install -q "$(wheel)[server]"
