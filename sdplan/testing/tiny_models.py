"""Tiny Llama models built at test time (no downloads) for the real-engine tests and the served accuracy benchmark.

* :func:`dummy_config`: a folder with only ``config.json``, for ``--load-format dummy`` timing.
* :func:`successor_models`: hand-built "successor" models with exactly known greedy behaviour
  (``docs/engines.md#successor-test-models``): the target's next token is ``t + 1``; draft ``mX`` instead predicts
  ``t + 2`` after every token with ``t % X == X - 1``, so acceptance is known exactly.

* :func:`served_pair`: a successor target and draft with word-level tokenizers, for ``vllm serve``
  (``tests/test_vllm_served.py``, ``benchmarks/accuracy_served.py``).

Needs torch and transformers (installed with vLLM), imported lazily: importing this module needs neither.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HIDDEN = 128  # vocab = hidden for the successor models; head_dim 32 is the CPU kernel's minimum


def dummy_config(folder: Path, hidden: int, layers: int, heads: int = 4, vocab: int = 1000) -> Path:
    from transformers import LlamaConfig

    folder.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4096,
                tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
                torch_dtype="float32").save_pretrained(folder)
    return folder


def word_tokenizer(folder: Path, vocab: int) -> Path:
    """A word-level tokenizer (``w0 w1 ...``, ``<unk>`` last) saved into a model folder.

    Decoding and re-encoding round-trip exactly, which ``vllm bench serve``'s
    random dataset needs; the server then detokenises and streams text like
    any deployment.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"w{i}": i for i in range(vocab - 1)}
    words["<unk>"] = vocab - 1
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>",
                            model_max_length=1 << 16).save_pretrained(folder)
    return folder


def served_pair(root: Path, hidden: int = 256, target_layers: int = 6, skip_every: int | None = 3) -> dict[str, Path]:
    """A successor target and draft with tokenizers, for ``vllm serve`` (real weights, known acceptance).

    The target (``target_layers`` identity layers: real compute, exact
    behaviour) emits ``t + 1``; the 1-layer draft disagrees after every token
    with ``t % skip_every == skip_every - 1``, so greedy acceptance is known.
    """
    target = _successor(root / "served-target", layers=target_layers, skip_every=None, hidden=hidden)
    draft = _successor(root / "served-draft", layers=1, skip_every=skip_every, hidden=hidden)
    for folder in (target, draft):
        word_tokenizer(folder, hidden)
    return {"target": target, "draft": draft}


def _successor(folder: Path, layers: int, skip_every: int | None, hidden: int = HIDDEN) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    HIDDEN = hidden  # noqa: N806 - the successor construction needs vocab = hidden
    config = LlamaConfig(vocab_size=HIDDEN, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         tie_word_embeddings=False, architectures=["LlamaForCausalLM"], torch_dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(HIDDEN))
        for layer in model.model.layers:  # each layer is the identity on the residual stream
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(HIDDEN, HIDDEN)
        for token in range(HIDDEN):
            step = 2 if skip_every and token % skip_every == skip_every - 1 else 1
            head[(token + step) % HIDDEN, token] = 1.0
        model.lm_head.weight.copy_(head)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def successor_models(root: Path, skips: tuple[int | None, ...] = (None, 2, 3, 5)) -> dict[str, Path]:
    """The target and one draft per entry of ``skips`` (None: an exact draft)."""
    models = {"target": _successor(root / "succ-target", layers=2, skip_every=None)}
    for skip in skips:
        name = "exact" if skip is None else f"m{skip}"
        models[name] = _successor(root / f"succ-draft-{name}", layers=1, skip_every=skip)
    return models


def simulate_acceptance(prompt: list[int], output_tokens: int, k: int,
                        skip_every: int | None) -> tuple[int, int, int, list[int]]:
    """Reference counts (drafts, draft tokens, accepted, accepted per position) for successor models.

    The target emits t+1 after t. Each cycle the draft proposes k tokens greedily from the last token;
    they are accepted while they match the target, then the target adds one token (the bonus). Every
    draft has k tokens and the last cycle may overshoot the budget, as in vLLM's counters.
    """
    def draft_next(token: int) -> int:
        step = 2 if skip_every and token % skip_every == skip_every - 1 else 1
        return (token + step) % HIDDEN

    last = (prompt[-1] + 1) % HIDDEN  # prefill emits the first token
    produced = 1
    drafts = accepted = 0
    per_position = [0] * k
    while produced < output_tokens:
        proposal, token = [], last
        for _ in range(k):
            token = draft_next(token)
            proposal.append(token)
        matched = 0
        while matched < k and proposal[matched] == (last + matched + 1) % HIDDEN:
            per_position[matched] += 1
            matched += 1
        drafts += 1
        accepted += matched
        produced += matched + 1
        last = (last + matched + 1) % HIDDEN
    return drafts, drafts * k, accepted, per_position


def successor_prompt_file(path: Path, count: int, prompt_tokens: int, output_tokens: int, vocab: int,
                          repeating: float = 1.0, seed: int = 0) -> Path:
    """A vLLM custom-dataset file (``{"prompt": ...}`` per line) for the successor target's word tokenizer.

    A fraction ``repeating`` of the prompts hold, before their last token ``L``, the run
    ``L, L+1, ..., L+output_tokens+8``: the target's greedy output ``L+1, L+2, ...`` then repeats the
    prompt, so n-gram (prompt lookup) drafts are accepted. The other prompts are random words, on
    which n-gram drafting finds nothing.
    """

    rng = random.Random(seed)

    def word(token: int) -> str:
        token %= vocab
        return "<unk>" if token == vocab - 1 else f"w{token}"

    lines = []
    for _ in range(count):
        last = rng.randrange(vocab)
        if rng.random() < repeating:
            ahead = [last + i for i in range(output_tokens + 9)]
            tail = max(1, prompt_tokens - len(ahead))
            tokens = ahead + [last - tail + 1 + i for i in range(tail)]
        else:
            tokens = [rng.randrange(vocab - 1) for _ in range(prompt_tokens)]
        lines.append(json.dumps({"prompt": " ".join(word(t) for t in tokens)}))
    path.write_text("\n".join(lines) + "\n")
    return path


# ----------------------------------------------------------------------------- EAGLE and MTP with known acceptance
# vLLM 0.32 replaces an explicit method by "eagle"/"eagle3" when the draft's (for mtp: the target's) path contains
# "eagle-", "eagle3", "dflash" or "dspark" (vllm/config/speculative.py): keep those words out of these folders' paths.


def eagle_head(target: Path, folder: Path, skip_every: int | None = None) -> Path:
    """An EAGLE-1 head for a successor target, for ``{"method": "eagle", "model": folder}``.

    vLLM's ``EagleLlamaForCausalLM`` takes a 1-layer Llama config and the weights ``fc`` (2H -> H, over
    the token embedding and the target's hidden state) and ``layers.0.*`` without ``input_layernorm``;
    it shares the target's embedding and ``lm_head`` (a saved ``lm_head`` is refused). With the
    attention and MLP outputs zeroed the head passes ``fc``'s output through, so ``fc = [P | 0]``
    makes it propose ``P(t) + 1``: ``P`` the identity (acceptance 1) or, with ``skip_every = X``,
    ``t + 1`` after every ``t % X == X - 1`` (the draft ``mX`` of :func:`successor_models`).
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, LlamaConfig

    config = AutoConfig.from_pretrained(target)
    hidden, inner = config.hidden_size, config.intermediate_size
    kv = config.num_key_value_heads * (hidden // config.num_attention_heads)
    folder.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=config.vocab_size, hidden_size=hidden, intermediate_size=inner, num_hidden_layers=1,
                num_attention_heads=config.num_attention_heads, num_key_value_heads=config.num_key_value_heads,
                max_position_embeddings=config.max_position_embeddings, rms_norm_eps=config.rms_norm_eps,
                tie_word_embeddings=False, architectures=["LlamaForCausalLM"],
                torch_dtype="float32").save_pretrained(folder)
    generator = torch.Generator().manual_seed(0)

    def small(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.02

    shift = torch.zeros(hidden, hidden)
    for token in range(hidden):
        step = 1 if skip_every and token % skip_every == skip_every - 1 else 0
        shift[(token + step) % hidden, token] = 1.0
    weights = {
        "layers.0.self_attn.q_proj.weight": small(hidden, hidden),
        "layers.0.self_attn.k_proj.weight": small(kv, hidden),
        "layers.0.self_attn.v_proj.weight": small(kv, hidden),
        "layers.0.self_attn.o_proj.weight": torch.zeros(hidden, hidden),
        "layers.0.mlp.gate_proj.weight": small(inner, hidden), "layers.0.mlp.up_proj.weight": small(inner, hidden),
        "layers.0.mlp.down_proj.weight": torch.zeros(hidden, inner),
        "layers.0.post_attention_layernorm.weight": torch.ones(hidden),
        "fc.weight": torch.cat([shift, torch.zeros(hidden, hidden)], dim=1),
    }
    save_file({name: tensor.contiguous() for name, tensor in weights.items()}, str(folder / "model.safetensors"))
    return folder


def mtp_successor(folder: Path, hidden: int = HIDDEN, layers: int = 2) -> Path:
    """A successor target with one MTP layer (MiMo architecture, Qwen2-style), for ``{"method": "mtp"}``.

    The main model emits ``t + 1`` like :func:`_successor`; the MTP layer (``model.mtp_layers.0.*``,
    vLLM's ``mimo_mtp.py``) keeps the input token's embedding (``input_proj = [0 | I]``, block outputs
    zeroed) and shares ``lm_head``, so it proposes the target's next token: acceptance 1 at any k.
    Serve it with ``--tokenizer`` pointing at a Llama folder with the same word tokenizer: transformers
    loads a Qwen2 tokenizer for this model type, which reads the word prompts as empty.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=hidden, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096,
                         tie_word_embeddings=False, architectures=["MiMoForCausalLM"], torch_dtype="float32",
                         num_nextn_predict_layers=1)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(hidden))
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(hidden, hidden)
        for token in range(hidden):
            head[(token + 1) % hidden, token] = 1.0
        model.lm_head.weight.copy_(head)
    state = {name: tensor.detach().clone().contiguous() for name, tensor in model.state_dict().items()}
    prefix = "model.mtp_layers.0."
    for name, tensor in model.model.layers[0].state_dict().items():  # a decoder block reused as the MTP block
        state[prefix + name] = tensor.detach().clone().contiguous()
    state[prefix + "self_attn.o_proj.weight"].zero_()
    state[prefix + "mlp.down_proj.weight"].zero_()
    state[prefix + "input_proj.weight"] = torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1)
    for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
        state[prefix + norm + ".weight"] = torch.ones(hidden)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    word_tokenizer(folder, hidden)
    return folder
