# The upload's unpack, run by `sh -c` in the container: host/node-protocol/src/upload/mod.rs
# (UNPACK) says what it does and why. Loaded by the host (include_str!) and by the edge
# (edge/build.sh makes edge/gen/unpack.js of it): this file is the only copy.
set -e
clean() { rm -rf -- "$@" 2>/dev/null || { chmod -R u+rwx -- "$@"; rm -rf -- "$@"; }; }
clean /workspace/.stockade-put-*
mkdir -- "$2"
trap 'clean "$2"' EXIT
tar -x --no-same-owner -f - -C "$2"
if [ ! -f "$2/$3" ] || [ -L "$2/$3" ]; then
  echo "stockade-put: the upload did not complete: nothing was written" >&2
  exit 1
fi
rm -f -- "$2/$3"
cd -- "$2"
if [ -z "$(find . -type d ! -perm -700 -print -quit)" ] && [ ! -e "$1" ] && [ ! -L "$1" ]; then
  mkdir -p -- "${1%/*}"
  cd /
  mv -- "$2" "$1"
  exit 0
fi
mkdir -p -- "$1"
if ! find . -mindepth 1 ! -type d -exec sh -c '
  for p; do
    if [ -d "$0/$p" ] && [ ! -L "$0/$p" ]; then echo "stockade-put: $p is a directory in $0" >&2; exit 1; fi
  done' "$1" {} +; then
  echo "stockade-put: nothing was written" >&2
  exit 1
fi
if [ -n "$(find . -type d ! -perm -700 -print -quit)" ]; then
  tar -cf - . | tar -x --no-same-owner -f - -C "$1"
  exit 0
fi
merge() {
  for p in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    if [ ! -e "$p" ] && [ ! -L "$p" ]; then continue; fi
    n=${p##*/}
    if [ -d "$p" ] && [ ! -L "$p" ]; then
      if [ -d "$2/$n" ] && [ ! -L "$2/$n" ]; then
        (merge "$p" "$2/$n")
        rmdir -- "$p"
      elif [ -e "$2/$n" ] || [ -L "$2/$n" ]; then
        rm -f -- "$2/$n"
      fi
    fi
  done
  find "$1" -mindepth 1 -maxdepth 1 -exec sh -c 'exec mv -f -- "$@" "$0"' "$2" {} +
}
merge "$2" "$1"
