#!/bin/bash
# Downloads the wheels that `python3 -m ingero_mcp.cli trace` (and `check`) need on the GPU host
# and that its image lacks, for Python 3.12 manylinux x86_64, into DEST (on the host, the driver
# installs DEST=.device/small/wheels/*.whl into /tmp/site).
#
#   bash bench/gpu/zoo/fetch_wheels.sh DEST [NAME==VERSION ...]
#
# Which: it imports the collector's whole path (the CLI's parser with every subcommand, the
# tracer, sampler, preflight, live view) in a venv that holds only what the host's image has and
# the collector could use (pyarrow numpy rich nvidia-ml-py psutil anyio typing-extensions), adds
# each module that fails to import as a wheel (the version this checkout's .venv has, if any),
# and tries again. As of this commit nothing is missing: the recording path needs only pyarrow
# (+ rich, psutil, nvidia-ml-py), which the host has; DuckDB and pydantic are needed only to
# read and explain, which happens here. Names given on the command line are downloaded as well.
set -eu
DEST=${1:?usage: fetch_wheels.sh DEST [NAME==VERSION ...]}
shift
cd "$(dirname "$0")/../../.."
mkdir -p "$DEST"
download() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any -d "$DEST" "$@"
}
[ $# -gt 0 ] && download "$@"

VENV=${ZOO_HOSTLIKE_VENV:-/tmp/zoo-hostlike-venv}
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q pyarrow numpy rich nvidia-ml-py psutil anyio typing-extensions
fi
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
for _ in 1 2 3 4 5 6 7 8 9 10; do
  missing=$(PYTHONPATH=$PWD/src:$SITE "$VENV/bin/python" - <<'PY'
import importlib
try:
    import ingero_mcp.cli as cli
    cli.build_parser()
    for m in ("ingero_mcp.cli.trace", "ingero_mcp.cli.check", "ingero_mcp.collector.preflight",
              "ingero_mcp.collector.tracer", "ingero_mcp.collector.sampler", "ingero_mcp.collector.liveview",
              "ingero_mcp.store.writer"):
        importlib.import_module(m)
except ModuleNotFoundError as exc:
    print(exc.name.split(".")[0])
PY
)
  if [ -z "$missing" ]; then
    echo "the collector's path imports with the host's packages + $(ls "$DEST" | wc -l) wheel(s) in $DEST"
    ls -la "$DEST"
    exit 0
  fi
  dist=${missing//_/-}
  ver=$(.venv/bin/python -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$dist" 2>/dev/null || true)
  echo "missing on the host: $missing -> wheel $dist${ver:+==$ver}"
  download "$dist${ver:+==$ver}"
  "$VENV/bin/pip" install -q --no-index --no-deps --target "$SITE" "$DEST"/*.whl
done
echo "still missing after 10 wheels: $missing" >&2
exit 1
