#!/usr/bin/env bash
# Which of the host's NVIDIA driver files the nix shell binds into its sandbox, read-only.
#
#   host-driver.sh DEST [DIR...]
#
# Prints one `SOURCE<TAB>DEST/lib/NAME` line per driver library (libcuda, libcudadebugger,
# libnvidia-*) of the first DIR that holds libcuda.so.1, and `SOURCE<TAB>DEST/bin/nvidia-smi` when
# nvidia-smi is on PATH: pixi's release binary is static (musl), cannot load libcuda, and learns the
# driver's CUDA version from nvidia-smi. Only these files: the directory that holds libcuda on most
# distributions also holds their libstdc++, which must not shadow the pixi environments' newer one.
#
# GPTFORGE_DRIVER_DIR, when set, is the only directory searched, and an error when it holds no
# libcuda.so.1. Nothing found is no error (a machine without a GPU): a note on stderr, no output.
# Runs on the host before the sandbox starts, with bash builtins only.
set -u

if (($# < 1)); then
    echo "usage: host-driver.sh DEST [DIR...]" >&2
    exit 2
fi
dest=$1
shift

if [[ -n ${GPTFORGE_DRIVER_DIR:-} ]]; then
    if [[ ! -e $GPTFORGE_DRIVER_DIR/libcuda.so.1 ]]; then
        echo "GPTFORGE_DRIVER_DIR=$GPTFORGE_DRIVER_DIR holds no libcuda.so.1: point it at the directory that does, or unset it" >&2
        exit 2
    fi
    dirs=("$GPTFORGE_DRIVER_DIR")
elif (($#)); then
    dirs=("$@")
else
    dirs=(
        /run/opengl-driver/lib      # NixOS
        /usr/lib/x86_64-linux-gnu   # Debian, Ubuntu
        /usr/lib64                  # Fedora, RHEL, openSUSE
        /usr/lib                    # Arch
        /usr/local/nvidia/lib64     # containers run by the NVIDIA container toolkit
    )
fi

found=
for dir in "${dirs[@]}"; do
    if [[ -e $dir/libcuda.so.1 ]]; then
        found=$dir
        break
    fi
done

if [[ -z $found ]]; then
    echo "gptforge shell: no NVIDIA driver found (set GPTFORGE_DRIVER_DIR to the directory holding libcuda.so.1; without a GPU, CONDA_OVERRIDE_CUDA=X.Y lets CUDA environments install)" >&2
    exit 0
fi

shopt -s nullglob
for file in "$found"/libcuda.so* "$found"/libcudadebugger.so* "$found"/libnvidia-*.so*; do
    # -e follows links: a dangling development symlink has nothing to bind
    [[ -e $file ]] && printf '%s\t%s\n' "$file" "$dest/lib/${file##*/}"
done

if smi=$(command -v nvidia-smi); then
    printf '%s\t%s\n' "$smi" "$dest/bin/nvidia-smi"
fi
exit 0
