"""One training forward of a decoder-only transformer, recorded op by op for ``_graph``.

The per-layer inventory generalises Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", section 4.1). Their count for a Megatron GPT
layer at 16 bits with dropout is ``sbh(34 + 5as/h)`` bytes:

- attention ``11sbh + 5as²b``: QKV input 2sbh, Q and K 4sbh, softmax output 2as²b, its
  dropout mask as²b and output 2as²b, V 2sbh, output-projection input 2sbh, dropout mask sbh;
- MLP ``19sbh``: fc input 2sbh, GeLU input 8sbh, GeLU output 8sbh, dropout mask sbh;
- two LayerNorm inputs ``4sbh``.

Recording each op with the element size of its real dtype gives that figure back exactly
(``tests/predict/test_predict.py`` checks it), and also the cases the formula does not cover:
fp32 activations (every 2 becomes 4), no dropout, SDPA/flash attention (no s² term: the
kernels keep Q, K, V, the output and a log-sum-exp; Dao et al. 2022, "FlashAttention"),
grouped KV heads, RMSNorm, SwiGLU, LoRA's frozen layers (a frozen linear does not keep its
input), autocast's casts and the LM head's logits.

Which tensors an op keeps follows ``tools/autograd/derivatives.yaml`` in PyTorch: an input
is kept only when the gradient of *another* input that requires grad needs it. What the
ops are follows Hugging Face ``transformers`` (``modeling_gpt2.py``, ``modeling_llama.py``,
``loss_utils.ForCausalLMLoss``) and nanoGPT.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ._graph import Op, Tensor

ROLES = ("q", "k", "v", "o", "gate", "up", "down", "norm", "embed", "head")
"""Parameter roles whose trainability changes what is saved (q covers a fused QKV)."""


@dataclass
class Arch:
    """The transformer and run settings the recorder needs (built from facts).

    Attributes:
        layers, hidden, heads, kv_heads, head_dim, intermediate, vocab: The shape.
        batch, seq: The batch shape of a training forward.
        param_elt: Bytes per element of the weights (and of activations without autocast).
        autocast_elt: Bytes per element autocast computes matmuls in, or None.
        device: ``"cuda"`` or ``"cpu"``: autocast's op lists and dropout masks differ.
        attention: ``"eager"``, ``"sdpa"`` or ``"flash_attention_2"``.
        norm: ``"layernorm"`` or ``"rmsnorm"``.
        norm_upcast: RMSNorm computed in fp32 and cast back (Hugging Face's LlamaRMSNorm).
        mlp: ``"gelu"`` (two matrices) or ``"gated"`` (SwiGLU/GeGLU: three).
        activation: ``"gelu_new"`` for GPT-2's tanh GeLU written out in Python (HF
            ``NewGELUActivation``: several ops, each keeping its own tensors); anything
            else is one fused op that keeps its input.
        fused_qkv: One QKV matrix (GPT-2) instead of q/k/v projections.
        rope: Rotary position embeddings applied to Q and K.
        softmax_fp32: Eager softmax computed in fp32 and cast back (HF LLaMA).
        attn_dropout, resid_dropout, embd_dropout: Dropout probabilities.
        learned_positions: A position embedding table (GPT-2).
        tied: LM head shares the token embedding.
        bias: Linear layers have biases.
        trainable: Role -> whether its base weights train.
        lora_rank: LoRA rank (0: none); ``lora_targets``: the roles it adapts.
        checkpointing: Layers run under activation checkpointing.
        checkpoint_every: Of those, every k-th (torchtitan's ``ac_freq``: layers k, 2k,
            ... counting from one); 1: every layer.
        upcast_logits: The loss upcasts logits to fp32 (HF ForCausalLMLoss).
        loss_parallel: The logits are sharded by vocabulary and the loss is torch's
            ``loss_parallel`` (tensor parallel): its log-softmax runs in steps.
        loss: ``inside`` (the model's, given labels), ``outside`` (after the model
            returned, the logits shifted by one and made contiguous: a copy) or
            ``outside-unshifted``.
        head_transform: BERT's MLM head: dense, GeLU and LayerNorm before the logits.
        parallel_residual: Attention and MLP read the same input (GPT-NeoX):
            ``x + attn(ln1(x)) + mlp(ln2(x))``.
        expand_kv: The model copies grouped K/V to every head itself, whatever the
            attention kernel (Falcon's ``_split_heads``).
        causal_mask: The model passes SDPA a b×s×s mask instead of ``is_causal``
            (Falcon).
        shared_norm: With ``parallel_residual``, one LayerNorm feeds both (Falcon-7B).
        broadcast_kv: One K/V head given to SDPA for every query head without
            ``enable_gqa`` (multi-query Falcon-7B): the CPU kernel takes its math path.
        rope_cat: Rotary embeddings joined to the unrotated part of each head by
            ``torch.cat`` (GPT-NeoX's partial rotary): Q comes out contiguous at
            (b, heads, s, d) rather than as a transposed view.
        image_elements: Pixels per image (channels x size²) of a vision transformer,
            whose patch embedding keeps its input; 0 for token inputs. ``vocab`` 0 means
            no LM head: a classifier on the CLS token instead, of ``classes`` classes.
    """

    layers: int
    hidden: int
    heads: int
    vocab: int
    batch: int
    seq: int
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None
    param_elt: int = 4
    autocast_elt: int | None = None
    device: str = "cuda"
    attention: str = "sdpa"
    norm: str = "layernorm"
    norm_upcast: bool = False
    mlp: str = "gelu"
    activation: str = "gelu"
    fused_qkv: bool = True
    rope: bool = False
    softmax_fp32: bool = False
    attn_dropout: float = 0.0
    resid_dropout: float = 0.0
    embd_dropout: float = 0.0
    learned_positions: bool = True
    tied: bool = True
    bias: bool = True
    trainable: dict[str, bool] = field(default_factory=dict)
    lora_rank: int = 0
    lora_targets: tuple[str, ...] = ()
    checkpointing: bool = False
    checkpoint_every: int = 1
    upcast_logits: bool = True
    loss_parallel: bool = False
    loss: str = "inside"
    head_transform: bool = False
    parallel_residual: bool = False
    expand_kv: bool = False
    causal_mask: bool = False
    shared_norm: bool = False
    broadcast_kv: bool = False
    rope_cat: bool = False
    image_elements: int = 0
    classes: int = 1000

    def __post_init__(self) -> None:
        self.kv_heads = self.kv_heads or self.heads
        self.head_dim = self.head_dim or self.hidden // self.heads
        if not self.intermediate:
            # GPT-2's 4h; a gated MLP of the same cost has 8h/3 (Shazeer 2020, "GLU Variants
            # Improve Transformer").
            self.intermediate = 4 * self.hidden if self.mlp != "gated" else 8 * self.hidden // 3

    def trains(self, role: str) -> bool:
        return self.trainable.get(role, True)


class _Recorder:
    """Records ops with PyTorch's saving rules, casting the way autocast does."""

    def __init__(self, arch: Arch) -> None:
        self.a = arch
        self.ops: list[Op] = []
        self.region: int | None = None
        self.rows = arch.batch * arch.seq

    # -- plumbing -------------------------------------------------------------------

    def new(self, numel: int, elt: int, rg: bool, amp: bool = False) -> Tensor:
        return Tensor(int(numel) * elt, rg, elt, amp)

    def op(
        self,
        inputs: list[Tensor],
        outputs: list[Tensor],
        saved: Sequence[Tensor | None] = (),
        params: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.ops.append(
            Op(list(inputs), list(outputs), [t for t in saved if t is not None], list(params))
        )
        self.ops[-1].region = self.region

    def numel(self, t: Tensor) -> int:
        return t.nbytes // t.elt

    def cast(self, x: Tensor, elt: int) -> Tensor:
        """``x.to(dtype)``: a copy when the dtype changes; ``_to_copy`` saves nothing."""
        if x.elt == elt:
            return x
        out = self.new(self.numel(x), elt, x.rg)
        self.op([x], [out])
        return out

    def unary(self, x: Tensor, save_input: bool = False, save_output: bool = False) -> Tensor:
        out = self.new(self.numel(x), x.elt, x.rg)
        self.op([x], [out], [x if save_input and x.rg else None, out if save_output else None])
        if save_output and not x.rg:
            self.ops[-1].saved.clear()
        return out

    def mul(self, a: Tensor, b: Tensor, numel: int | None = None) -> Tensor:
        """``a * b``: keeps ``b`` for ``a``'s gradient and ``a`` for ``b``'s."""
        n = numel if numel is not None else max(self.numel(a), self.numel(b))
        out = self.new(n, max(a.elt, b.elt), a.rg or b.rg)
        self.op([a, b], [out], [b if a.rg else None, a if b.rg else None])
        return out

    def add(self, a: Tensor, b: Tensor) -> Tensor:
        """``a + b`` keeps nothing; the result has the wider dtype (type promotion)."""
        out = self.new(max(self.numel(a), self.numel(b)), max(a.elt, b.elt), a.rg or b.rg)
        self.op([a, b], [out])
        return out

    def fp32_op(self, x: Tensor) -> Tensor:
        """Inputs of ops on CUDA autocast's float32 list (softmax, layer_norm, pow, ...)."""
        if self.a.autocast_elt and self.a.device == "cuda":
            return self.cast(x, 4)
        return x

    def lp_op(self, x: Tensor) -> Tensor:
        """Inputs of ops on autocast's lower-precision list (linear, matmul, bmm, SDPA)."""
        return self.cast(x, self.a.autocast_elt) if self.a.autocast_elt else x

    # -- layers ---------------------------------------------------------------------

    def linear(self, x: Tensor, n_in: int, n_out: int, key: str, role: str) -> Tensor:
        """``nn.Linear`` (plus LoRA's ``B(A(x)) * scale`` when its role is adapted)."""
        a = self.a
        trains = a.trains(role)
        base = self._linear(x, n_in, n_out, key, trains, a.bias)
        if a.lora_rank and role in a.lora_targets:
            low = self._linear(x, n_in, a.lora_rank, key + ".lora_A", True, False)
            up = self._linear(low, a.lora_rank, n_out, key + ".lora_B", True, False)
            scaled = self.unary(up)  # * scaling: a Python number, nothing kept
            base = self.add(base, scaled)
        return base

    def _linear(
        self, x: Tensor, n_in: int, n_out: int, key: str, trains: bool, bias: bool
    ) -> Tensor:
        a = self.a
        xin = self.lp_op(x)
        w_numel = n_in * n_out + (n_out if bias else 0)
        weight = None
        if a.autocast_elt:
            # Autocast casts the weight on use and caches the copy for the forward
            # (autocast_mode.cpp, cached_cast) only where the weight requires grad; a
            # frozen one (LoRA's base) is cast afresh at each use, and its copy is then an
            # activation like any other the linear keeps for the input gradient.
            weight = self.new(w_numel, a.autocast_elt, trains, amp=trains)
            self.op([], [weight])
        rows = self.numel(x) // n_in
        out = self.new(rows * n_out, xin.elt, xin.rg or trains)
        # addmm/mm: grad of the weight needs the input; grad of the input needs the weight.
        params = [(key, w_numel * a.param_elt)] if trains else []
        inputs = [xin] + ([weight] if weight is not None else [])
        # A trainable weight's copy stays in autocast's cache to the forward's end even
        # where no input gradient needs it (a patch embedding of images): counted as kept.
        self.op(
            inputs,
            [out],
            [
                xin if trains else None,
                weight if (weight is not None and (xin.rg or trains)) else None,
            ],
            params,
        )
        return out

    def norm(self, x: Tensor, key: str) -> Tensor:
        a = self.a
        trains = a.trains("norm")
        h = a.hidden
        params = [(key, (2 if a.norm == "layernorm" and a.bias else 1) * h * a.param_elt)]
        params = params if trains else []
        rg = x.rg or trains
        fused = a.norm == "layernorm" or (
            not a.norm_upcast and a.device == "cuda" and a.norm == "rmsnorm"
        )
        if fused:
            # native_layer_norm (and CUDA's fused rms_norm) keep the input, mean and rstd.
            xin = self.fp32_op(x)
            out = self.new(self.numel(xin), xin.elt, rg)
            stats = self.new(self.rows * (2 if a.norm == "layernorm" else 1), 4, False)
            self.op([xin], [out, stats], [xin, stats] if rg else [], params)
            return out
        # RMSNorm written out (HF LlamaRMSNorm upcasts to fp32; torch's RMSNorm on the CPU
        # is the same composite without the casts).
        x32 = self.cast(x, 4) if a.norm_upcast else self.fp32_op(x)
        sq = self.unary(x32, save_input=True)  # pow(x, 2)
        var = self.new(self.rows, x32.elt, x32.rg)
        self.op([sq], [var])  # mean: keeps only sizes
        rstd = self.unary(var, save_output=True)  # rsqrt(var + eps) keeps its result
        normed = self.mul(x32, rstd, self.numel(x32))
        normed = self.cast(normed, x.elt) if a.norm_upcast else normed
        w = Tensor(h * a.param_elt, trains, a.param_elt)  # the parameter: no new memory
        out = self.new(self.numel(normed), max(a.param_elt, normed.elt), normed.rg or trains)
        self.op([normed], [out], [normed if trains else None], params)
        del w
        return out

    def dropout(self, x: Tensor, p: float) -> Tensor:
        if p <= 0:
            return x
        # CUDA's fused native_dropout keeps a bool mask (1 byte, as Korthikanti count); the
        # CPU path (ATen Dropout.cpp, is_fused_kernel_acceptable is false) multiplies by a
        # noise tensor of the input's dtype and keeps that.
        mask = self.new(self.numel(x), 1 if self.a.device == "cuda" else x.elt, False)
        out = self.new(self.numel(x), x.elt, x.rg)
        self.op([x], [out, mask], [mask] if x.rg else [])
        return out

    def copy(self, x: Tensor, numel: int | None = None) -> Tensor:
        """A reshape of a non-contiguous view: a contiguous copy, nothing kept."""
        out = self.new(numel if numel is not None else self.numel(x), x.elt, x.rg)
        self.op([x], [out])
        return out

    def rope(self, x: Tensor, numel: int | None = None) -> Tensor:
        """``x * cos + rotate_half(x) * sin``: cos/sin need no grad, so nothing big is kept.

        Args:
            x: Q or K, or the fused QKV tensor they are views of.
            numel: Their size, when ``x`` is the fused tensor.
        """
        n = numel if numel is not None else self.numel(x)
        t1 = self.new(n, x.elt, x.rg)
        self.op([x], [t1])
        half = self.new(n // 2, x.elt, x.rg)
        self.op([x], [half])  # -x2
        rot = self.new(n, x.elt, x.rg)
        self.op([half, x], [rot])  # cat
        t2 = self.unary(rot)
        return self.add(t1, t2)

    def attention(self, x: Tensor, layer: int) -> Tensor:
        a = self.a
        b, s, h, heads = a.batch, a.seq, a.hidden, a.heads
        d = a.head_dim or h // heads
        kv = (a.kv_heads or heads) * d
        q_n = full = b * s * heads * d
        if a.fused_qkv:
            qkv = self.linear(x, h, heads * d + 2 * kv, f"{layer}.qkv", "q")
            q = k = v = self.lp_op(qkv)
            k_n = v_n = b * s * kv
        else:
            q = self.linear(x, h, heads * d, f"{layer}.q", "q")
            k = self.linear(x, h, kv, f"{layer}.k", "k")
            v = self.linear(x, h, kv, f"{layer}.v", "v")
            k_n = v_n = b * s * kv
        if a.rope:
            q = self.rope(q, q_n)
            k = self.rope(k, k_n)
        dropout_on_cpu_sdpa = a.device == "cpu" and a.attn_dropout > 0
        broadcast_on_cpu = a.device == "cpu" and a.broadcast_kv
        math_path = a.attention == "eager" or dropout_on_cpu_sdpa or broadcast_on_cpu
        # HF repeat_kv: expand + reshape, a copy at the full head count, for eager. SDPA
        # with no mask (a training batch without padding) takes grouped K/V as they are
        # (enable_gqa, transformers' use_gqa_in_sdpa), as flash_attention_2 does; its math
        # path still expands them, and so does SDPA for heads wider than 256.
        wide = a.attention == "sdpa" and d > 256
        repeated = (math_path or wide or a.expand_kv) and kv != heads * d
        if repeated:
            k = self.copy(k, full)
            v = self.copy(v, full)
            k_n = v_n = full
        if math_path:
            y = self._math_attention(q, k, v, (q_n, k_n, v_n), repeated)
        else:
            y = self._fused_attention(q, k, v, q_n)
        out = self.linear(y, heads * d, h, f"{layer}.o", "o")
        return self.dropout(out, a.resid_dropout)

    def _math_attention(
        self, q: Tensor, k: Tensor, v: Tensor, sizes: tuple[int, int, int], repeated: bool
    ) -> Tensor:
        """Attention as matmuls and a softmax (eager, or SDPA's math path)."""
        a = self.a
        b, s, heads = a.batch, a.seq, a.heads
        q_n, k_n, v_n = sizes
        # matmul folds (b, heads) for bmm: Q, and K/V unless repeat_kv already made
        # them contiguous, are transposed views and become contiguous copies. SDPA's
        # math path on the CPU computes a 16-bit input in fp32 (ATen attention.cpp):
        # the cast is the copy, and the product stays fp32 until the output linear.
        upcast = a.attention != "eager" and a.device == "cpu" and bool(a.autocast_elt)

        def operand(t: Tensor, numel: int, contiguous: bool) -> Tensor:
            """Q, K or V (``numel`` of it: ``t`` may be the fused QKV) as bmm takes it."""
            if upcast and t.elt != 4:
                out = self.new(numel, 4, t.rg)
                self.op([t], [out])
                return out
            t = t if upcast else self.lp_op(t)
            return t if contiguous else self.copy(t, numel)

        qc = operand(q, q_n, False)
        kc = operand(k, k_n, repeated)
        scores = self.new(b * heads * s * s, qc.elt, qc.rg or kc.rg)
        self.op([qc, kc], [scores], [qc if kc.rg else None, kc if qc.rg else None])
        scaled = self.unary(scores)  # * 1/sqrt(d), masked_fill: nothing big kept
        masked = self.unary(scaled)
        if a.softmax_fp32:
            probs = self.cast(masked, 4)
            probs = self.unary(probs, save_output=True)
            probs = self.cast(probs, qc.elt)
        else:
            probs = self.unary(self.fp32_op(masked), save_output=True)
        probs = self.dropout(probs, a.attn_dropout)
        probs = probs if upcast else self.lp_op(probs)
        vc = operand(v, v_n, repeated)
        ctx = self.new(q_n, probs.elt, probs.rg or vc.rg)
        self.op([probs, vc], [ctx], [probs if vc.rg else None, vc if probs.rg else None])
        return self.copy(ctx)  # transpose(1, 2).reshape(b, s, h)

    def _fused_attention(self, q: Tensor, k: Tensor, v: Tensor, q_n: int) -> Tensor:
        """SDPA's flash or memory-efficient kernel (or flash_attention_2)."""
        a = self.a
        b, s, heads = a.batch, a.seq, a.heads
        # Flash/memory-efficient SDPA keeps Q, K, V, the output and a log-sum-exp, no
        # s×s matrix (Dao et al. 2022); its output transposes back without a copy.
        # The kernels (CPU and CUDA alike) take strided views of the fused QKV as they
        # are and keep them: one view left (GPT-NeoX's V, its Q and K rotated into new
        # tensors) keeps the whole QKV storage alive.
        qs, ks, vs = self.lp_op(q), self.lp_op(k), self.lp_op(v)
        y = self.new(q_n, qs.elt, qs.rg or ks.rg or vs.rg)
        lse = self.new(b * heads * s, 4, False)
        keep = [qs, ks, vs, y, lse] if y.rg else []
        if a.causal_mask and a.device == "cpu":
            # The CPU kernel keeps its own copy of the mask, in Q's dtype, per layer
            # (measured on fake tensors and in a run; CUDA's kernels not checked).
            mask = self.new(b * s * s, qs.elt, False)
            self.op([], [mask])
            keep += [mask] if y.rg else []
        self.op([qs, ks, vs], [y, lse], keep)
        if a.rope_cat and a.device == "cpu":
            # The CPU kernel lays its output out as Q is: rotated through torch.cat,
            # Q is contiguous at (b, heads, s, d), so the transpose back to
            # (b, s, heads·d) is a copy, and the output linear keeps that copy.
            # CUDA's kernels write (b, s, heads, d) whatever Q's layout.
            y = self.copy(y)
        return y

    def mlp(self, x: Tensor, layer: int) -> Tensor:
        a = self.a
        h, f = a.hidden, a.intermediate or 4 * a.hidden
        if a.mlp == "gated":
            gate = self.linear(x, h, f, f"{layer}.gate", "gate")
            up = self.linear(x, h, f, f"{layer}.up", "up")
            act = self.unary(gate, save_input=True)  # silu keeps its input
            inner = self.mul(act, up)
        else:
            fc = self.linear(x, h, f, f"{layer}.up", "up")
            if a.activation == "gelu_new":
                inner = self.gelu_new(fc)
            else:
                inner = self.unary(fc, save_input=True)  # gelu keeps its input
        out = self.linear(inner, f, h, f"{layer}.down", "down")
        return self.dropout(out, a.resid_dropout)

    def gelu_new(self, x: Tensor) -> Tensor:
        """HF ``NewGELUActivation``: ``0.5 * x * (1 + tanh(c * (x + 0.044715 * x**3)))``.

        pow keeps its input (in fp32 under CUDA autocast: pow is on its float32 list,
        so the sum and tanh are fp32 too); tanh keeps its output; the final product keeps
        both factors. Scalar multiplications and additions keep nothing.
        """
        cubed = self.unary(self.fp32_op(x), save_input=True)  # pow(x, 3)
        inner = self.unary(self.add(x, self.unary(cubed)))  # c * (x + 0.044715 * x**3)
        t = self.unary(inner, save_output=True)  # tanh
        return self.mul(self.unary(x), self.unary(t))  # (0.5 * x) * (1 + t)

    def block(self, x: Tensor, layer: int) -> Tensor:
        """A pre-norm decoder layer: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

        (BERT's post-norm layer keeps the same tensors: each LayerNorm's input, each
        linear's input. GPT-NeoX's parallel layer reads ``x`` twice, kept once.)
        """
        if self.a.parallel_residual and self.a.shared_norm:
            normed = self.norm(x, f"{layer}.norm1")
            return self.add(self.add(x, self.attention(normed, layer)), self.mlp(normed, layer))
        if self.a.parallel_residual:
            attn = self.attention(self.norm(x, f"{layer}.norm1"), layer)
            mlp = self.mlp(self.norm(x, f"{layer}.norm2"), layer)
            return self.add(self.add(x, attn), mlp)
        x = self.add(x, self.attention(self.norm(x, f"{layer}.norm1"), layer))
        return self.add(x, self.mlp(self.norm(x, f"{layer}.norm2"), layer))

    def model(self) -> Tensor:
        """Embeddings, layers, final norm, LM head and cross-entropy loss; returns the loss."""
        a = self.a
        h = a.hidden
        rows = self.rows
        embed = a.trains("embed")
        if a.image_elements:
            # Patch embedding: a strided conv of the image (kept for the weight's gradient).
            pixels = self.new(a.batch * a.image_elements, a.param_elt, False)
            self.op([], [pixels])
            x = self._linear(pixels, a.image_elements // max(1, a.seq - 1), h, "patch", embed, True)
            x = self.copy(x, rows * h)  # cat with the CLS token
        else:
            x = self.new(rows * h, a.param_elt, embed)
            self.op([], [x], [], [("embed", a.vocab * h * a.param_elt)] if embed else [])
        if a.learned_positions:
            pos = self.new(a.seq * h, a.param_elt, embed)
            self.op([], [pos], [], [("pos", a.seq * h * a.param_elt)] if embed else [])
            x = self.add(x, pos)
        x = self.dropout(x, a.embd_dropout)
        for layer in range(a.layers):
            ckpt = a.checkpointing and (layer + 1) % max(a.checkpoint_every, 1) == 0
            self.region = layer if ckpt else None
            x = self.block(x, layer)
        self.region = None
        x = self.norm(x, "norm_f")
        if not a.vocab:
            # No vocabulary (ViT): a classifier on the CLS token; logits and loss are tiny.
            cls = self.new(a.batch * h, x.elt, x.rg)
            self.op([x], [cls])  # select the CLS row: a view, its backward scatters
            logits = self._linear(cls, h, a.classes, "classifier", a.trains("head"), True)
            # The row is a view of the whole sequence's output: kept uncast (no autocast
            # copy to keep instead), it keeps that whole storage.
            saved = self.ops[-1].saved
            saved[:] = [x if t is cls else t for t in saved]
            loss = self.new(1, 4, logits.rg)
            self.op([self.unary(self.cast(logits, 4), save_output=True)], [loss])
            return loss
        if a.head_transform:
            # BERT's MLM head: dense, GeLU, LayerNorm, then the (tied) decoder.
            t = self.linear(x, h, h, "head.dense", "head")
            x = self.norm(self.unary(t, save_input=True), "head.norm")
        head_trains = a.trains("embed") if a.tied else a.trains("head")
        key = "embed" if a.tied else "head"
        logits = self._linear(x, h, a.vocab, key, head_trains, False)
        if a.loss.startswith("outside"):
            return self.outside_loss(logits)
        held = logits
        if a.upcast_logits or a.autocast_elt:
            # HF's loss upcasts; cross_entropy is on both autocast float32 lists anyway.
            logits = self.cast(logits, 4)
        if a.loss_parallel:
            return self.parallel_loss(logits)
        # cross_entropy = log_softmax (keeps its fp32 output) + nll_loss (keeps the target).
        logp = self.unary(logits, save_output=True)
        loss = self.new(1, 4, logp.rg)
        self.op([logp], [loss])
        if held is not logits:
            # The model's output holds its own logits until the loss returns with it.
            self.op([held], [self.new(0, 4, False)])
        return loss

    def outside_loss(self, logits: Tensor) -> Tensor:
        """Cross-entropy after the model returned its logits, which the caller holds
        until the loss returns: ``logits[:, :-1].contiguous()`` copies them (``outside``),
        and autocast's fp32 cross-entropy casts them."""
        a = self.a
        held = logits
        if a.loss == "outside":
            logits = self.copy(logits, self.numel(logits) * (a.seq - 1) // max(a.seq, 1))
        if a.autocast_elt:
            logits = self.cast(logits, 4)
        logp = self.unary(logits, save_output=True)
        loss = self.new(1, 4, logp.rg)
        self.op([logp], [loss])
        # The caller lets go of the logits once the loss returned (no gradient flows here).
        self.op([held], [self.new(0, 4, False)])
        return loss

    def parallel_loss(self, logits: Tensor) -> Tensor:
        """Cross-entropy on logits sharded by vocabulary (torch's ``loss_parallel``,
        ``tensor/parallel/loss.py``): the log-softmax in steps, each a logits-sized tensor,
        while the model's output still holds the logits."""
        n = self.numel(logits)
        peak = self.new(n // max(self.a.vocab, 1), logits.elt, False)
        self.op([logits], [peak])  # amax over the shard, all-reduced
        shifted = self.new(n, logits.elt, logits.rg)
        self.op([logits, peak], [shifted])  # x - max
        lse = self.new(self.numel(peak), logits.elt, False)
        self.op([self.unary(shifted)], [lse])  # exp, summed and all-reduced, log
        logp = self.new(n, logits.elt, logits.rg)
        # shifted - log-sum-exp keeps its result; the logits are read here only to say
        # that the model's output keeps them alive until the loss returns.
        self.op([shifted, lse, logits], [logp], [logp])
        loss = self.new(1, 4, logp.rg)
        self.op([logp], [loss])
        return loss


def record(arch: Arch) -> tuple[list[Op], Tensor]:
    """The recorded training forward of ``arch`` and the loss it returns."""
    rec = _Recorder(arch)
    loss = rec.model()
    return rec.ops, loss
