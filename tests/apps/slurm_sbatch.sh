#!/usr/bin/env bash
# slurm_sbatch.sh BUILD_DIR WORK_DIR SOURCE_DIR: runs scripts/slurm/train_resnet.sbatch as a Slurm job
# would (SLURM_* set, the script's own settings from the environment) with a stand-in `srun` that drops
# srun's options and starts the program under mpirun with SLURM_NTASKS ranks. Proves the train_resnet
# command line the script builds is valid and that a second submission resumes from the checkpoint.
set -euo pipefail
build=$1; work=$2; src=$3
rm -rf "$work"; mkdir -p "$work/bin"
cat > "$work/bin/srun" <<'SH'
#!/usr/bin/env bash
while [[ $# -gt 0 && $1 == -* ]]; do shift; done
exec mpirun -np "$SLURM_NTASKS" --allow-run-as-root --oversubscribe "$@"
SH
chmod +x "$work/bin/srun"
run() {
  (cd "$work" && PATH="$work/bin:$PATH" SLURM_SUBMIT_DIR="$work" SLURM_JOB_ID=42 SLURM_NTASKS=2 SLURM_JOB_NUM_NODES=1 \
     SLURM_JOB_NODELIST=localhost RINGTRAIN_BUILD="$build" ARCH=resnet20 BATCH=8 EPOCHS=1 WARMUP_EPOCHS=0 \
     EXTRA="--steps $1 --image-size 16 --threads 1 --synthetic-size 64" bash "$src/scripts/slurm/train_resnet.sbatch")
}
run 2
test -f "$work/runs/42/ckpt-step00000002.h5"
run 4 | tee "$work/second.log"
grep -q "resumed from .*ckpt-step00000002.h5: step 2" "$work/second.log"
test -f "$work/runs/42/ckpt-step00000004.h5"
echo "sbatch script ran and resumed"
