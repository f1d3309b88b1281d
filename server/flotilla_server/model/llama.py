"""DecoderModel: the Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, Gemma 3, Phi-3/Phi-4, Qwen3-MoE,
Mixtral) in plain PyTorch.

One forward pass takes the flat tokens of a whole step (prefill chunks and decode rows of many
sequences) and reads/writes the paged KV pool; it has no per-token Python loop. Q/K/V and gate/up
projections are fused into one matmul each; `load_hf_state_dict` maps Hugging Face weight names onto
the fused layout. float32 on CPU (grad disabled, kernels built), the ops between the matmuls are native
(model/decode_ops.py): a residual add and the next norm in one op, RoPE with the K/V write in another, a
decode step's attention in one with them; other dtypes and devices run the same math in torch ops, and so
do Qwen3's QK norm and Phi's partial rotary (the native ops rotate whole heads, with no norm before).
Gemma 3 is the same decoder with what its config sets (config.py): norms after each sublayer too, scaling
by 1 + weight, a tanh GELU, scaled embeddings, and sliding-window layers with their own RoPE base; it runs
the torch ops (its QK norms already keep it off the fused native attention). Qwen3-MoE and Mixtral are Qwen3
and Mistral whose sparse layers (ModelConfig.is_sparse) hold a mixture of experts (model/moe.py) as `mlp`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType
from torch import nn

from . import decode_ops
from .attention import AttentionBatch, paged_attention
from .config import ModelConfig
from .fp8_weights import Fp8Linear
from .hf_state_dict import load_hf_state_dict
from .kv_tensors import KVCacheTensors
from .linear import Linear, PackedWeight, linear, packs
from .moe import SparseMoeBlock
from .quant_experts import QuantizedExperts
from .quant_linear import Int8Embedding, Int8Linear, QuantizedEmbedding, QuantizedLinear
from .rope import inverse_frequencies, longrope_cos_sin, rope_cos_sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, weight_offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.weight_offset = weight_offset  # Gemma: 1.0, the scale is 1 + weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight_offset:  # Gemma: normalised and scaled in float32, then cast (as transformers does)
            h = x.float()
            h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
            return (h * (self.weight_offset + self.weight.float())).type_as(x)
        if x.dtype == torch.float32:  # one fused op (native or F.rms_norm): the same math as below
            return decode_ops.rms_norm(x, self.weight, self.eps)
        # normalise in float32, scale in the model dtype (as transformers does)
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.num_heads, self.kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rotary_dim = cfg.rotary_dim  # under head_dim: the rest of each head passes unrotated
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.split = (q_size, kv_size, kv_size)
        self.qkv_proj = Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=cfg.qkv_bias)
        self.o_proj = Linear(q_size, cfg.hidden_size, bias=cfg.o_bias)
        offset = cfg.norm_weight_offset
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, offset) if cfg.qk_norm else None
        self.scale = cfg.attention_scale if cfg.attention_scale is not None else 1.0 / math.sqrt(cfg.head_dim)
        self.window = cfg.window(layer)  # 0: global attention

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: AttentionBatch,
        kv: KVCacheTensors,
        layer: int,
    ) -> torch.Tensor:
        num_tokens = x.shape[0]
        qkv = self.qkv_proj.forward(x)
        windowed = self.window and batch.cut_by(self.window)  # a window that hides no key needs no mask
        if (self.q_norm is None and not windowed and self.rotary_dim == self.head_dim and decode_ops.native_for(qkv)
                and qkv.is_contiguous()):
            ops = decode_ops.native
            if not batch.prefills and batch.decode_tables is not None:
                # a decode step: RoPE, the KV write and attention over the pools in one native op
                o = ops.decode_attention(qkv, cos, sin, kv.k[layer], kv.v[layer], batch.slot_mapping,
                                         batch.decode_tables, batch.decode_context_lens, batch.block_size, self.scale,
                                         self.num_heads, self.kv_heads)
                return self.o_proj.forward(o)
            # q and k rotated in place in the fused output, k and v written to the pool: one native op
            ops.rope_kv_write(qkv, cos, sin, kv.k[layer], kv.v[layer], batch.slot_mapping, self.num_heads,
                              self.kv_heads)
            q_size, kv_size = self.split[0], self.split[1]
            q = qkv[:, :q_size].view(num_tokens, self.num_heads, self.head_dim)
            k = qkv[:, q_size:q_size + kv_size].view(num_tokens, self.kv_heads, self.head_dim)
            v = qkv[:, q_size + kv_size:].view(num_tokens, self.kv_heads, self.head_dim)
            o = paged_attention(q, k, v, kv, layer, batch, self.scale)
            return self.o_proj.forward(o.reshape(num_tokens, -1))
        q, k, v = qkv.split(self.split, dim=-1)
        v = v.view(num_tokens, self.kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q.view(num_tokens, self.num_heads, self.head_dim))
            k = self.k_norm(k.view(num_tokens, self.kv_heads, self.head_dim))
            q, k = decode_ops.rotate_half(q, cos, sin), decode_ops.rotate_half(k, cos, sin)
        else:  # q and k heads lie side by side in the fused output: one rotation for both (half the ops)
            qk = decode_ops.rotate_half(qkv[:, : self.split[0] + self.split[1]].view(num_tokens, -1, self.head_dim),
                                        cos, sin)
            q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        kv.write(layer, batch.slot_mapping, k, v)
        o = paged_attention(q, k, v, kv, layer, batch, self.scale, self.window)
        return self.o_proj(o.reshape(num_tokens, -1))


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gate_up_proj = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        self.gelu = cfg.hidden_act == "gelu_pytorch_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.gelu:
            gate, up = gate_up.chunk(2, dim=-1)
            return self.down_proj(F.gelu(gate, approximate="tanh") * up)
        return self.down_proj(decode_ops.silu_mul(gate_up))


class DecoderLayer(nn.Module):
    """Llama's layer: x + attn(norm(x)), then x + mlp(norm(x)), where `post_attention_layernorm` is the MLP's
    input norm. With sandwich norms (Gemma 3) the names are Gemma's: `post_attention_layernorm` norms the
    attention's output, `pre_feedforward_layernorm` the MLP's input and `post_feedforward_layernorm` its output."""

    def __init__(self, cfg: ModelConfig, layer: int = 0) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, layer)
        self.mlp = SparseMoeBlock(cfg.moe) if cfg.is_sparse(layer) else MLP(cfg)
        offset = cfg.norm_weight_offset
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)
        if cfg.sandwich_norms:
            self.pre_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)
            self.post_feedforward_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, offset)


class DecoderModel(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        # an uninitialised weight, as every other one here (the loader fills it): Embedding's own random init on
        # the meta device goes through torch._refs, which imports torch._dynamo (~3 s of CPU) in every process
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size,
                                         _weight=torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, config.norm_weight_offset)
        self.lm_head = None if config.tie_word_embeddings else Linear(
            config.hidden_size, config.vocab_size, bias=False
        )
        self._inv_freq: dict[bool, torch.Tensor] = {}  # float32 by `long` (LongRoPE's 2nd set), on the weights' device
        self._local_inv_freq: torch.Tensor | None = None  # the sliding layers' (Gemma 3), likewise
        self._logits_weight = PackedWeight()  # the head's packed weight (the embedding's when tied)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The activations' and KV cache's dtype (`--dtype`): the norms', which are never quantized."""
        return self.norm.weight.dtype

    def _inverse_frequencies(self, long: bool = False) -> torch.Tensor:
        device = self.norm.weight.device
        inv_freq = self._inv_freq.get(long)
        if inv_freq is None or inv_freq.device != device:
            cfg = self.config
            inv_freq = inverse_frequencies(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling, long).to(device)
            self._inv_freq[long] = inv_freq
        return inv_freq

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, rotary_dim] of the step's positions (broadcast over heads); LongRoPE's by
        rope.py's rule, per token by position."""
        scaling = self.config.rope_scaling
        if scaling is not None and scaling.rope_type == "longrope":
            cos, sin = longrope_cos_sin(positions, self._inverse_frequencies(), self._inverse_frequencies(long=True),
                                        scaling, self.compute_dtype)
        else:
            cos, sin = rope_cos_sin(positions, self._inverse_frequencies(), self.compute_dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)

    def _local_inverse_frequencies(self) -> torch.Tensor:
        """The sliding layers' frequencies: their own base, never scaled (Gemma 3's local RoPE)."""
        device = self.norm.weight.device
        if self._local_inv_freq is None or self._local_inv_freq.device != device:
            cfg = self.config
            self._local_inv_freq = inverse_frequencies(cfg.head_dim, cfg.local_rope_theta, None).to(device)
        return self._local_inv_freq

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        batch: AttentionBatch,
        kv: KVCacheTensors,
    ) -> torch.Tensor:
        """input_ids, positions: [T] for the step's flat tokens. Returns the final-norm hidden states
        [T, hidden]; pick the rows to sample and pass them to `compute_logits`."""
        cos, sin = self._cos_sin(positions)
        h = self.embed_tokens(input_ids)
        if self.config.sandwich_norms:
            return self._sandwich_layers(h, positions, cos, sin, batch, kv)
        if decode_ops.native_for(h):
            return self._native_layers(h, cos, sin, batch, kv)
        for i, layer in enumerate(self.layers):
            h = h + layer.self_attn(layer.input_layernorm(h), cos, sin, batch, kv, i)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.norm(h)

    def _sandwich_layers(self, h: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         batch: AttentionBatch, kv: KVCacheTensors) -> torch.Tensor:
        """Gemma 3's layer loop: embeddings scaled, each sublayer's output normed before its residual add, and
        the sliding layers rotated by their own RoPE base."""
        cfg = self.config
        if cfg.embedding_scale is not None:  # the scale in the model dtype, as transformers multiplies it
            h = h * torch.tensor(cfg.embedding_scale, dtype=torch.float32).to(h.dtype)
        local = (cos, sin)
        if cfg.local_rope_theta is not None and any(cfg.layer_windows):
            local_cos, local_sin = rope_cos_sin(positions, self._local_inverse_frequencies(), self.compute_dtype)
            local = (local_cos.unsqueeze(1), local_sin.unsqueeze(1))
        for i, layer in enumerate(self.layers):
            layer_cos, layer_sin = local if cfg.window(i) else (cos, sin)
            attn = layer.self_attn(layer.input_layernorm(h), layer_cos, layer_sin, batch, kv, i)
            h = h + layer.post_attention_layernorm(attn)
            h = h + layer.post_feedforward_layernorm(layer.mlp(layer.pre_feedforward_layernorm(h)))
        return self.norm(h)

    def _native_layers(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch,
                       kv: KVCacheTensors) -> torch.Tensor:
        """The layer loop on the native float32 ops (model/decode_ops.py): each residual add and the norm after it
        are one op, and modules are called by `forward` (nn.Module's __call__ costs ~0.7 us, eight a layer).
        On the 2-core Xeon VM (family 6 model 167), SmolLM2-135M at batch 1 and 150 keys, 2 threads: a layer
        165 against 347 us on the torch ops, a step's forward 5.9 against 11.3 ms (1 thread: 270 against 470 us,
        9.4 against 15.4 ms).
        Rule: h is the embedding's fresh output, so the residual stream is added into it in place."""
        ops, layers = decode_ops.native, self.layers
        norms = [layer.input_layernorm for layer in layers]
        x = ops.rms_norm(h, norms[0].weight, norms[0].eps)
        for i, layer in enumerate(layers):
            attn, mlp, post = layer.self_attn, layer.mlp, layer.post_attention_layernorm
            x = ops.add_rms_norm(h, attn.forward(x, cos, sin, batch, kv, i), post.weight, post.eps)
            after = norms[i + 1] if i + 1 < len(layers) else self.norm
            if isinstance(mlp, SparseMoeBlock):
                out = mlp.forward(x)
            else:
                out = mlp.down_proj.forward(ops.silu_mul(mlp.gate_up_proj.forward(x)))
            x = ops.add_rms_norm(h, out, after.weight, after.eps)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [N, hidden] rows of `forward`'s output. Returns float32 logits [N, vocab], soft-capped where
        the config says so (cap * tanh(logits / cap))."""
        logits = self._head(hidden)
        cap = self.config.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None and isinstance(self.embed_tokens, (QuantizedEmbedding, Int8Embedding)):
            return self.embed_tokens.logits(hidden)
        if isinstance(self.lm_head, (QuantizedLinear, Int8Linear)):
            return self.lm_head(hidden).float()
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return linear(hidden, weight, None, self._logits_weight).float()

    def packed_copy_bytes(self) -> int:
        """Memory of the packed copies the CPU matmul paths keep beside the weights (model/linear.py): every
        projection's and the head's (`_logits_weight` packs the embedding when the head is tied)."""
        weights = [m.weight for m in self.modules() if isinstance(m, Linear)]
        if self.lm_head is None and isinstance(self.embed_tokens, nn.Embedding):
            weights.append(self.embed_tokens.weight)
        return sum(w.numel() * w.element_size() for w in weights if packs(w))

    def weight_bytes(self) -> int:
        """Every byte of weights the model holds: its parameters, the blocks (or int8 weights and scales) of
        its quantized modules and, on CPU, the packed copies the matmuls keep (what the KV pool's sizing and the
        model cache count)."""
        params = sum(p.numel() * p.element_size() for p in self.parameters())
        quantized = (QuantizedLinear, QuantizedEmbedding, QuantizedExperts, Int8Linear, Int8Embedding, Fp8Linear)
        blocks = sum(b.numel() * b.element_size() for m in self.modules()
                     if isinstance(m, quantized) for b in m.buffers(recurse=False))
        return params + blocks + self.packed_copy_bytes()

    def quantization(self) -> str:
        """What the weights are held as: `none` (all in the model dtype), `int8` (projections, embedding and
        head as per-channel int8), `fp8` (projections as per-channel e4m3), or `gguf:` and the block types of
        the quantized projections and embedding, by name (`gguf:Q4_1+Q8_0`)."""
        if any(isinstance(m, (Int8Linear, Int8Embedding)) for m in self.modules()):
            return "int8"
        if any(isinstance(m, Fp8Linear) for m in self.modules()):
            return "fp8"
        types = {t for m in self.modules() if isinstance(m, (QuantizedLinear, QuantizedExperts)) for t in m.qtypes}
        types |= {m.qtype for m in self.modules() if isinstance(m, QuantizedEmbedding)}
        return "gguf:" + "+".join(sorted(GGMLQuantizationType(t).name for t in types)) if types else "none"

    def to_int8(self) -> None:
        """Swaps every projection, the embedding and an untied head for per-channel int8 ones
        (quant_linear.Int8Linear, Int8Embedding), quantized from the weights loaded; the norms stay in the
        model dtype. One weight at a time: its float copy is freed as its int8 one is made. The shapes are
        source.check_int8's to check, before loading."""
        dtype = self.compute_dtype
        with torch.no_grad():
            self.embed_tokens = Int8Embedding(self.embed_tokens.weight, dtype)
            if self.lm_head is not None:
                self.lm_head = Int8Linear(self.lm_head.weight, None, dtype)
            for owner, attr in self._projections():
                dense = getattr(owner, attr)
                setattr(owner, attr, Int8Linear(dense.weight, dense.bias, dtype))
        self._logits_weight = PackedWeight()

    def to_fp8(self) -> None:
        """Swaps every projection for an e4m3 one with a float32 scale per output row (fp8_weights.Fp8Linear),
        one weight at a time; the embedding, the head and the norms stay in the model dtype (fp8_weights.py
        says why). The shapes and the GPU are source.check_fp8's and the loader's to check, before loading."""
        dtype = self.compute_dtype
        with torch.no_grad():
            for owner, attr in self._projections():
                dense = getattr(owner, attr)
                setattr(owner, attr, Fp8Linear(dense.weight, dense.bias, dtype))

    def _projections(self) -> list[tuple[nn.Module, str]]:
        """(owner, attribute) of every layer's projections, which requantization swaps: four, or two where the
        layer's MLP is a mixture of experts (source.check_int8 and check_fp8 refuse those models)."""
        return [(owner, attr) for layer in self.layers
                for owner, attr in ((layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj"),
                                    (layer.mlp, "gate_up_proj"), (layer.mlp, "down_proj"))
                if owner is layer.self_attn or not isinstance(layer.mlp, SparseMoeBlock)]

    def load_hf_state_dict(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copies Hugging Face-named weights into the fused (and, for experts, stacked) layout
        (model/hf_state_dict.py). Raises ValueError naming any weight that is missing or unexpected."""
        load_hf_state_dict(self, tensors)
