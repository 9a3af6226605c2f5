#!/usr/bin/env bash
# The main job on a fresh machine: installs dependencies, builds, tokenizes the English fortunes corpus
# (Debian package `fortunes`) into HDF5 shards with `gpt-train prep`, trains the small byte-level model
# of configs/quickstart.yaml on CPU under mpirun (2 data-parallel ranks by default, NP=... to change),
# reports validation and test perplexity next to the corpus' unigram baseline, and draws the loss curves
# into runs/quickstart/metrics.png (scripts/plot_metrics.py), and prints a few fortunes the model writes
# from an empty prompt (`gpt-train generate`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
NP=${NP:-2}
mkdir -p runs/data runs/quickstart
if [ ! -f runs/data/fortunes.index.json ]; then
  ./build/gpt-train prep --input /usr/share/games/fortunes --doc-separator % --tokenizer bytes \
    --output-prefix runs/data/fortunes | tee runs/quickstart/prep.log
fi
rm -rf runs/quickstart/metrics.jsonl runs/quickstart/checkpoints  # a fresh run every time
mpirun --oversubscribe --bind-to none -np "$NP" ./build/gpt-train train --config configs/quickstart.yaml "$@"
mpirun --oversubscribe --bind-to none -np "$NP" ./build/gpt-train eval --config configs/quickstart.yaml --load runs/quickstart/checkpoints --iters 0 "$@"
/usr/bin/python3 - <<'PY'
import json
evals = [json.loads(l) for l in open("runs/quickstart/metrics.jsonl") if '"perplexity"' in l]
index = json.load(open("runs/data/fortunes.index.json"))
baseline = index.get("unigram_perplexity")
for e in evals[-2:]:
    print(f"{e['split']:>5} perplexity {e['perplexity']:.2f}  (unigram baseline {baseline:.2f})")
PY
if /usr/bin/python3 scripts/plot_metrics.py runs/quickstart/metrics.jsonl -o runs/quickstart/metrics.png \
     --title "quickstart: $(date +%F)" >/dev/null; then
  echo "loss curves: runs/quickstart/metrics.png"
fi
echo "three fortunes sampled from the trained model (gpt-train generate --load runs/quickstart/checkpoints):"
./build/gpt-train generate --load runs/quickstart/checkpoints --num-samples 3 --max-new-tokens 200 \
  --temperature 0.8 --top-k 40 --seed "${SEED:-1}"
