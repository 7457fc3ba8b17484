"""The e2e tier's model: a random-weight Llama (hidden 64, 2 layers) and a BPE tokenizer trained here.

No model can be downloaded on this machine, and the tier needs none: it checks that requests flow through
a prefill/decode pair, not what they answer. Both files are deterministic (fixed seeds, a generated
corpus), so the plugin-on and plugin-off runs of one session serve the very same model.

Run as ``python -m tests.e2e.tinymodel DIR`` inside the e2e venv (torch, transformers and tokenizers).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

VOCAB_SIZE = 512
HIDDEN_SIZE = 64
LAYERS = 2
MAX_POSITIONS = 2048
WORDS = (
    "prefill decode room status bootstrap transfer kv cache redis lease token request router server "
    "model layer attention tensor page index ready failed success waiting input sender receiver "
    "the a of to and in is for on with as by at from that this be are was it an or not"
).split()


def corpus(lines: int = 2000, seed: int = 7) -> list[str]:
    """A generated, seeded corpus of short sentences over :data:`WORDS` and numbers."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [
            rng.choice(WORDS) if rng.random() < 0.85 else str(rng.randrange(1000)) for _ in range(rng.randrange(4, 16))
        ]
        out.append(" ".join(words) + rng.choice([".", "?", "!", ","]))
    return out


def build(directory: Path) -> Path:
    """Write config, safetensors weights and tokenizer files to ``directory`` (created); returns it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    directory.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.model_max_length = MAX_POSITIONS
    fast.save_pretrained(directory)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=4 * HIDDEN_SIZE,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=2,
        initializer_range=0.5,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(directory, safe_serialization=True)
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.e2e.tinymodel DIR")
    print(build(Path(sys.argv[1])))
