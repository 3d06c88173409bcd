"""Sequential reference for GDN verification and accepted-state reconstruction.

Written straight from Qwen3-Next's gated delta rule, one token at a time, in float64 by default. It calls
none of the fast kernels. Shapes and argument meanings are those of `gdn_verify` / `gdn_reconstruct`. The recurrence
runs on the CPU unless `device` names another (the same torch ops there, e.g. float64 on a GPU: thousands of small
ops per request that would otherwise take host cores).

Per request (slot s, tokens x_0..x_{L-1}) and value head h (k-head h // (HV // H)):
    window        = conv_state[s, :W-1]                        (oldest first)
    c_t           = silu(bias + sum_j w[:, j] * [window, x_0..x_t][t + j])   (the last W inputs)
    q_t, k_t, v_t = split(c_t);  q_t, k_t <- x / sqrt(|x|^2 + 1e-6)
    g_t           = -exp(A_log) * softplus(a_t + dt_bias)      (softplus(x) = x above 20)
    beta_t        = sigmoid(b_t)
    S_t           = exp(g_t) S_{t-1} + beta_t (v_t - exp(g_t) S_{t-1} k_t) k_t^T      S: [V, K]
    o_t           = S_t q_t * K**-0.5
"""
import torch

CONV_L2NORM_EPS = 1e-6  # vLLM's in-kernel q/k L2 norm: x * rsqrt(sum(x^2) + 1e-6)
SOFTPLUS_THRESHOLD = 20.0  # vLLM's fused_sigmoid_gating default


def _head_counts(mixed_qkv, ssm_state):
    num_v_heads, head_v_dim, head_k_dim = ssm_state.shape[1:]
    num_k_heads = (mixed_qkv.shape[1] - num_v_heads * head_v_dim) // (2 * head_k_dim)
    return num_k_heads, num_v_heads, head_k_dim, head_v_dim


def _on(device, *tensors):
    return [None if t is None else t.to(device) for t in tensors]


def _walk_request(x, a, b, conv_weight, conv_bias, A_log, dt_bias, window, state, num_k_heads, scale, dtype):
    """Yields (o_t [HV, V], S_t [HV, V, K], window_t [W-1, D]) after each token of one request."""
    num_v_heads, head_v_dim, head_k_dim = state.shape
    key_dim = num_k_heads * head_k_dim
    heads_per_k_head = num_v_heads // num_k_heads
    weight = conv_weight.to(dtype)
    bias = None if conv_bias is None else conv_bias.to(dtype)
    state = state.to(dtype).clone()
    history = window.to(dtype)
    for t in range(x.shape[0]):
        history = torch.cat([history, x[t : t + 1].to(dtype)])
        taps = history[-weight.shape[1] :]  # [W, D], oldest first
        conv = (taps.T * weight).sum(dim=1)
        if bias is not None:
            conv = conv + bias
        conv = conv * torch.sigmoid(conv)
        q = conv[:key_dim].view(num_k_heads, head_k_dim)
        k = conv[key_dim : 2 * key_dim].view(num_k_heads, head_k_dim)
        v = conv[2 * key_dim :].view(num_v_heads, head_v_dim)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + CONV_L2NORM_EPS)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + CONV_L2NORM_EPS)
        gate_in = a[t].to(dtype) + dt_bias.to(dtype)
        softplus = torch.where(gate_in <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(gate_in)), gate_in)
        g = -torch.exp(A_log.to(dtype)) * softplus
        beta = torch.sigmoid(b[t].to(dtype))
        out = torch.empty(num_v_heads, head_v_dim, dtype=dtype, device=state.device)
        for h in range(num_v_heads):
            kh, qh = k[h // heads_per_k_head], q[h // heads_per_k_head]
            decayed = torch.exp(g[h]) * state[h]
            state[h] = decayed + beta[h] * torch.outer(v[h] - decayed @ kh, kh)
            out[h] = state[h] @ qh * scale
        yield out, state.clone(), history[-(weight.shape[1] - 1) :].clone()


def naive_gdn_verify(
    mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
    scale=None, dtype=torch.float64, device="cpu",
):
    """Every token's core attention output [T, HV, V] (in `dtype`, on `device`); states are left untouched.

    A request whose slot is 0 (vLLM's null block) gets zero outputs.
    """
    num_k_heads, num_v_heads, head_k_dim, head_v_dim = _head_counts(mixed_qkv, ssm_state)
    scale = head_k_dim**-0.5 if scale is None else scale
    width = conv_weight.shape[-1]
    out = torch.zeros(mixed_qkv.shape[0], num_v_heads, head_v_dim, dtype=dtype, device=device)
    for i in range(state_indices.shape[0]):
        bos, eos, slot = int(cu_seqlens[i]), int(cu_seqlens[i + 1]), int(state_indices[i])
        if slot <= 0:
            continue
        steps = _walk_request(
            *_on(device, mixed_qkv[bos:eos], a[bos:eos], b[bos:eos], conv_weight, conv_bias, A_log, dt_bias,
                 conv_state[slot, : width - 1], ssm_state[slot]), num_k_heads, scale, dtype,
        )
        for t, (o_t, _, _) in enumerate(steps):
            out[bos + t] = o_t
    return out


def naive_gdn_reconstruct(
    mixed_qkv, a, b, conv_weight, conv_bias, A_log, dt_bias, conv_state, ssm_state, state_indices, cu_seqlens,
    num_accepted, scale=None, dtype=torch.float64, parts="all", checkpoint_indices=None, checkpoint_lens=None,
    device="cpu",
):
    """Advances conv_state and ssm_state of each request by its first num_accepted[i] tokens, in place.

    num_accepted[i] in 0..L_i (0 leaves the request's states as they are); slot 0 requests are skipped.
    checkpoint_indices / checkpoint_lens (both or neither): a request that commits also stores the states after its
    first min(checkpoint_lens[i], n_i) tokens into slot checkpoint_indices[i], unless that slot is <= 0 or its own.
    The replay runs on `device`; the states are stored back in their own dtype and device. parts "conv" / "ssm"
    store only that state; the replay always starts from the conv window passed in, i.e. the window at the start of
    the step being committed (for the fold: replay parts="ssm" before that window is advanced, or replay "all" on
    copies).

    The fold of `gdn_verify(fold=GDNFold(...))` is, per request, this function with parts="ssm" over the previous
    step's inputs and counts, followed by `naive_gdn_verify` of the current step.
    """
    if parts not in ("all", "conv", "ssm"):
        raise ValueError(f'parts must be "all", "conv" or "ssm", got {parts!r}')
    if (checkpoint_indices is None) != (checkpoint_lens is None):
        raise ValueError("checkpoint_indices and checkpoint_lens go together: pass both or neither")
    num_k_heads, _, head_k_dim, _ = _head_counts(mixed_qkv, ssm_state)
    scale = head_k_dim**-0.5 if scale is None else scale
    width = conv_weight.shape[-1]
    writes = []  # (slot, ssm state, conv window), stored after every replay: a replay reads states as they were
    for i in range(state_indices.shape[0]):
        bos, slot = int(cu_seqlens[i]), int(state_indices[i])
        n = min(int(num_accepted[i]), int(cu_seqlens[i + 1]) - bos)
        if slot <= 0 or n <= 0:
            continue
        c_slot = 0 if checkpoint_indices is None else int(checkpoint_indices[i])
        c = 0 if checkpoint_lens is None else min(int(checkpoint_lens[i]), n)
        steps = _walk_request(
            *_on(device, mixed_qkv[bos : bos + n], a[bos : bos + n], b[bos : bos + n], conv_weight, conv_bias, A_log,
                 dt_bias, conv_state[slot, : width - 1], ssm_state[slot]), num_k_heads, scale, dtype,
        )
        for t, (_, state, window) in enumerate(steps):
            if t + 1 == c and c_slot > 0 and c_slot != slot:
                writes.append((c_slot, state, window))
        writes.append((slot, state, window))
    for slot, state, window in writes:
        if parts != "conv":
            ssm_state[slot] = state.to(ssm_state.dtype)
        if parts != "ssm":
            conv_state[slot, : width - 1] = window.to(conv_state.dtype)
