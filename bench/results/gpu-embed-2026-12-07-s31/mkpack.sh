#!/usr/bin/env bash
# mkpack.sh NAME BIN... : stripped binaries + their non-system libs -> .carry/NAME.tar.xz (gpubin/)
set -euo pipefail
cd /work/main
name=$1; shift
st=$(mktemp -d); mkdir -p $st/gpubin/lib
for b in "$@"; do
  p=$(find build -type f -name "$b" -perm -u+x | head -1)
  [ -n "$p" ] || { echo "missing $b" >&2; exit 1; }
  strip -o $st/gpubin/$b $p
  ldd $p | awk '/=> \// {print $3}' | while read -r lib; do
    case "$(basename $lib)" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|libcudart*|libcublas*|libnv*|libcudnn*|libnccl*|libcu*) ;;
      *) [ -e $st/gpubin/lib/$(basename $lib) ] || cp -L $lib $st/gpubin/lib/ ;;
    esac
  done
done
tar cf - -C $st gpubin | xz ${XZLEVEL:--6} -T2 > .carry/$name.tar.xz
ls -la .carry/$name.tar.xz; rm -rf $st
