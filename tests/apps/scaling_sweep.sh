#!/usr/bin/env bash
# scaling_sweep.sh BUILD_DIR WORK_DIR SOURCE_DIR: a tiny weak-scaling sweep (1 and 2 ranks, a few steps)
# through scripts/scaling.py with the allreduce_bench model check; the CSV, the three PNGs and the
# model's predicted-vs-measured table must come out right.
set -euo pipefail
build=$1; work=$2; src=$3
rm -rf "$work"
/usr/bin/python3 "$src/scripts/scaling.py" --out "$work" --build "$build" --ranks 1,2 --steps 6 --batch 8 --repeats 2 \
  --extra "--image-size 16" --allreduce-bench
/usr/bin/python3 - "$work" <<'PY'
import csv, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = list(csv.DictReader(open(out / "scaling.csv")))
assert [(r["ranks"], r["status"]) for r in rows] == [("1", "ok"), ("2", "ok")], rows
for r in rows:
    assert float(r["median_step_s"]) > 0 and float(r["img_per_s"]) > 0 and r["repeats"] == "2", r
    assert 0 < float(r["efficiency"]) <= 1.5, r
    assert sum(float(r[k + "_s"]) for k in ("forward", "backward", "optimizer")) > 0, r
assert float(rows[0]["efficiency"]) == 1.0 and rows[1]["global_batch"] == "16", rows
for name in ("throughput", "efficiency", "breakdown"):
    data = (out / f"{name}.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
table = (out / "model_check.md").read_text()
assert any(line.startswith("| 2 |") for line in table.splitlines()), table
print("sweep ok: csv, 3 plots, model check")
PY
# A bad flag names itself; a failed run is reported and makes the sweep fail.
if /usr/bin/python3 "$src/scripts/scaling.py" --out "$work/bad" --build "$build" --mode strong --global-batch 9 --ranks 1,2 2> "$work/err"; then
  echo "uneven strong-scaling batch accepted" >&2; exit 1
fi
grep -q -- "--global-batch 9 does not split evenly over \[2\] ranks" "$work/err"
if /usr/bin/python3 "$src/scripts/scaling.py" --out "$work/fail" --build "$build" --ranks 1 --steps 2 --extra "--lr -1" 2> "$work/err"; then
  echo "a failing run did not fail the sweep" >&2; exit 1
fi
grep -q "1 of 1 runs failed" "$work/err"
echo "sweep errors ok"
# Inside a Slurm allocation the sweep launches with srun (here a stand-in that starts the ranks with mpirun).
mkdir -p "$work/bin"
cat > "$work/bin/srun" <<'SH'
#!/usr/bin/env bash
echo "srun $*" >> "$(dirname "$0")/srun.calls"
n=1
while [[ $# -gt 0 && $1 == -* ]]; do [[ $1 == -n ]] && { n=$2; shift; }; shift; done
exec mpirun -np "$n" --allow-run-as-root --oversubscribe "$@"
SH
chmod +x "$work/bin/srun"
PATH="$work/bin:$PATH" SLURM_JOB_ID=7 SLURM_NTASKS=2 /usr/bin/python3 "$src/scripts/scaling.py" --out "$work/slurm" \
  --build "$build" --steps 2 --batch 4 --extra "--image-size 8" --no-plots > "$work/slurm.log"
grep -q "^srun -n 2 --mpi=pmix" "$work/bin/srun.calls"
grep -q "weak   resnet20  ring        2 .* ok" "$work/slurm.log"
echo "sweep under slurm ok"
