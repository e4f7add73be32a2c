# Sourced by the scripts/setup_*.sh peer builders. make_peer_venv V: a venv at V that sees this
# checkout's .venv packages (torch 2.13 CPU, numpy, h5py, onnxruntime, ...) after its own, so a
# peer installs only what it adds or pins differently (its own numpy < 2, overrides, spaCy, ...):
# seconds to a couple of minutes instead of a second torch download.
# ELMO_MAIN_VENV overrides the venv it shares (default: the checkout's .venv, built by make install).
make_peer_venv() {
  local venv=$1 root main own
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  main=${ELMO_MAIN_VENV:-$root/.venv}
  [ -x "$main/bin/python" ] || { echo "no $main/bin/python: run make install first" >&2; return 1; }
  rm -rf "$venv"
  python3 -m venv "$venv"
  own=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$main/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])" > "$own/zz_elmo_main_venv.pth"
}
