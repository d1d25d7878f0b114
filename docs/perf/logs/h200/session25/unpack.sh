# Sourced by lease.sh and lease2.sh: from the repository root, unpacks the pack in folder $1 into
# .gpu-carry and makes OUT_ROOT (the device's $OUT, else $2) for the results.
cd "$(dirname "${BASH_SOURCE[0]}")/../../../../.."
OUT_ROOT=${OUT:-$2}
mkdir -p "$OUT_ROOT"
tar -xzf "$1/carry.tgz"
C=.gpu-carry
export LD_LIBRARY_PATH=$PWD/$C/lib
