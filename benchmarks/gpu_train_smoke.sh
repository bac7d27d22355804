#!/usr/bin/env bash
# benchmarks/gpu_check.sh, stage 3: fairseq-train smokes in half precision on the device.
#
#   bash benchmarks/gpu_train_smoke.sh OUT_DIR DEV UPDATES MAX_TOKENS [DOC_TOKENS]
#
# RUNS (default: lsg_bart_tiny and locost_tiny, each with --fp16 and --bf16), --optimizer grouped_adam (LOCOST
# with its own --ssm-lr), UPDATES updates on the seeded synthetic set (short documents, words as
# tokens, DOC_TOKENS long: default 300), logging every update. Writes OUT_DIR/<arch>_<precision>.log and OUT_DIR/train_smoke.json:
# per run, the losses, whether they are finite and fell, and the optimizer's group lines.
set -euo pipefail
out=$1 dev=$2 updates=$3 max_tokens=$4 doc_tokens=${5:-300}
PYTHON=${PYTHON:-python}
mkdir -p "$out"
data="$out/data"
if [ ! -f "$data/bin/dict.source.txt" ]; then
    "$PYTHON" scripts/make_synthetic_data.py --output-dir "$data" --force --train 64 --valid 8 --test 8 \
        --min-tokens $(( doc_tokens / 2 )) --max-tokens "$doc_tokens" --min-keys 1 --max-keys 1 --seed 1 > /dev/null 2>&1
    "$PYTHON" scripts/jsonl_to_parallel.py --input-dir "$data" --output-dir "$data/raw" > /dev/null 2>&1
    fairseq-preprocess --source-lang source --target-lang target --trainpref "$data/raw/train" \
        --validpref "$data/raw/valid" --destdir "$data/bin" --joined-dictionary --workers 1 > /dev/null 2>&1
fi
device_flags=()
[ "$dev" = cpu ] && device_flags=(--cpu)
# lsg_fairseq.user_dir() without running the package (importing it imports fairseq: ~3 s of a CPU)
user_dir=$("$PYTHON" -c "import importlib.util as u, os; print(os.path.dirname(u.find_spec('lsg_fairseq').origin))")
# On a GPU the runs go side by side (nothing here is timed; each spends ~20 s starting and compiling,
# which one after the other took 163 of the first reading's 440 s); on a CPU one after the other.
pids=()
for run in ${RUNS:-lsg_bart_tiny:fp16 lsg_bart_tiny:bf16 locost_tiny:fp16 locost_tiny:bf16}; do
    arch=${run%:*} precision=${run#*:}
    arch_flags=(--max-source-positions 512 --max-target-positions 64 --truncate-target)
    [ "$arch" = lsg_bart_tiny ] && arch_flags+=(--block-size 32 --sparse-block-size 32)
    [ "$arch" = locost_tiny ] && arch_flags+=(--ssm-lr 1e-4)
    log="$out/${arch}_${precision}.log"
    fairseq-train "$data/bin" --user-dir "$user_dir" --task long_document_summarization --arch "$arch" \
        "${arch_flags[@]}" --optimizer grouped_adam --lr 1e-3 --weight-decay 0.01 --clip-norm 1.0 \
        --max-tokens "$max_tokens" --max-update "$updates" --log-format simple --log-interval 1 \
        --disable-validation --no-save --save-dir "$out/ck_${arch}_${precision}" --seed 1 \
        --num-workers 0 "--$precision" "${device_flags[@]}" > "$log" 2>&1 \
        || echo "fairseq-train $arch --$precision failed (see $log)" >&2 &
    if [ "$dev" = cpu ]; then wait $!; else pids+=($!); fi
done
[ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"
"$PYTHON" - "$out" <<'EOF'
import json, math, os, re, sys
out = sys.argv[1]
runs = []
for log in sorted(f for f in os.listdir(out) if f.endswith(".log")):
    arch, precision = log[:-len(".log")].rsplit("_", 1)
    text = open(os.path.join(out, log), errors="replace").read()
    losses = [float(x) for x in re.findall(r"train_inner \| .*? loss=([-0-9.naninf]+)", text)]
    groups = re.findall(r"grouped_adam: group .*", text)
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    runs.append({"arch": arch, "precision": precision, "updates": len(losses), "losses": losses,
                 "finite": finite, "fell": finite and losses[-1] < losses[0], "groups": groups,
                 "non_flat_note": "float32 master copies kept per tensor" in text})
with open(os.path.join(out, "train_smoke.json"), "w") as f:
    json.dump(runs, f, indent=1)
bad = [f"{r['arch']} --{r['precision']}" for r in runs if not r["fell"]]
print("train smokes: " + ("every loss finite and falling" if not bad else "NOT finite and falling: " + ", ".join(bad)))
sys.exit(1 if bad else 0)
EOF
