# Sourced by scripts/test and scripts/demo: create or update .venv and export
# what PySpark needs. Needs Python 3.11+ (PYTHON overrides the interpreter).
VENV="${LR_VENV:-$PWD/.venv}"
PYTHON="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.lr-installed"
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -e '.[dev,spark]'
  touch "$stamp"
fi
export PYSPARK_PYTHON="$VENV/bin/python"
export PYSPARK_DRIVER_PYTHON="$VENV/bin/python"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export PATH="$VENV/bin:$PATH"
