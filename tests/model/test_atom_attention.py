"""Sequence-local atom attention (AF3 Algorithm 7) against full attention with a hand-built mask,
and the atom encoder's features."""

import pytest
import torch

from featurecache.model import preset
from featurecache.model.network.atom_attention import (
    REFERENCE_FEATURE_DIM,
    AtomAttentionEncoder,
    AtomWindows,
    reference_features,
)
from featurecache.model.network.transformer import GATE_BIAS_INIT, ConditionedAttention, TokenLayout
from featurecache.testing.compare import summation_tolerance
from featurecache.testing.synthetic import random_batch


def _local_bias(num_atoms: int, queries: int, keys: int) -> torch.Tensor:
    """AF3's beta_lm: 0 where |l - c| < queries / 2 and |m - c| < keys / 2 for a subset centre
    c in {queries/2 - 0.5, 3 queries/2 - 0.5, ...}, else -1e10."""
    bias = torch.full((num_atoms, num_atoms), -1e10)
    centre = queries / 2 - 0.5
    while centre - queries / 2 < num_atoms:
        for query in range(num_atoms):
            for m in range(num_atoms):
                if abs(query - centre) < queries / 2 and abs(m - centre) < keys / 2:
                    bias[query, m] = 0.0
        centre += queries
    return bias


@pytest.mark.parametrize(
    "num_atoms, real_atoms, queries, keys",
    [
        (45, 45, 8, 24),  # not a multiple of the window
        (45, 38, 8, 24),  # padding atoms at the end
        (70, 61, 32, 128),  # AF3's windows, more keys than atoms
        (200, 187, 32, 128),  # AF3's windows, several of them, padding
    ],
)
def test_windowed_attention_equals_full_attention_with_a_block_mask(num_atoms, real_atoms, queries, keys):
    generator = torch.Generator().manual_seed(num_atoms + real_atoms)
    c_a, c_s, c_pair, heads, samples = 16, 8, 4, 2, 2
    attention = ConditionedAttention(c_a, c_s, c_pair, heads, kernels="torch")
    for parameter in attention.parameters():  # the gates start constant: randomise everything
        parameter.data.normal_(generator=generator).mul_(0.5)
    a = torch.randn(1, samples, num_atoms, c_a, generator=generator)
    s = torch.randn(1, 1, num_atoms, c_s, generator=generator)
    pair = torch.randn(1, num_atoms, num_atoms, c_pair, generator=generator)
    pad_mask = torch.arange(num_atoms)[None, :] < real_atoms

    windows = AtomWindows(pad_mask, queries, keys)
    query_index = windows.query_index.clamp(max=num_atoms - 1)
    window_pair = pair[:, query_index[:, :, None], windows.key_index[:, None, :]]  # [1, W, Q, K, c_pair]
    local = attention(a, s, window_pair, windows)
    full = attention(a, s, pair, TokenLayout(pad_mask, extra_bias=_local_bias(num_atoms, queries, keys)[None]))
    assert local.shape == full.shape == a.shape
    # the full attention's softmax sums run over every atom (the masked ones add zeros), the
    # windowed one's over its keys: the same terms in another order
    tolerance = summation_tolerance(torch.float32, num_atoms)
    torch.testing.assert_close(local[:, :, :real_atoms], full[:, :, :real_atoms], atol=tolerance, rtol=tolerance)


def test_windows_are_afs_subset_centres():
    windows = AtomWindows(torch.ones(1, 70, dtype=torch.bool), queries=32, keys=128)
    assert windows.num_windows == 3
    assert windows.query_index[1].tolist() == list(range(32, 64))
    # centre 47.5: keys 47.5 +- 64 -> atoms -16 .. 111; slots of atoms outside 0..69 masked
    assert windows.key_mask[0, 1].nonzero().flatten().tolist() == list(range(16, 16 + 70))
    assert windows.key_index[1, 16].item() == 0 and windows.key_index[1, 17].item() == 1


def test_reference_features_one_hots():
    batch = random_batch([5], [2], [0], torch.Generator().manual_seed(0), num_atoms_per_token=3)
    features = reference_features(batch)
    assert features.shape[-1] == REFERENCE_FEATURE_DIM == 389
    element = features[..., 5:133]
    assert (element.argmax(-1) == batch["ref_element"]).all() and (element.sum(-1) == 1).all()
    names = features[..., 133:].unflatten(-1, (4, 64))
    assert (names.argmax(-1) == batch["ref_atom_name_chars"]).all()


def test_atom_pair_features_only_within_a_reference_space():
    """p_lm's reference-conformer terms vanish between atoms of different ref_space_uid."""
    config = preset("tiny", kernels="torch", atom_window_queries=4, atom_window_keys=8)
    encoder = AtomAttentionEncoder(config, c_token=config.trunk.c_s, with_trunk=False)
    batch = random_batch([6], [2], [0], torch.Generator().manual_seed(1), num_atoms_per_token=2)
    captured = {}
    encoder.pair_from_same_space.register_forward_hook(lambda m, i, o: captured.update(same=i[0]))
    windows = AtomWindows(batch["atom_pad_mask"], 4, 8)
    encoder.condition(batch, windows)
    same = captured["same"][0, 1, ..., 0]  # window 1: queries atoms 4..7, keys atoms 2..9
    uid = batch["ref_space_uid"][0]
    expected = (uid[4:8, None] == uid[None, 2:10]).float()
    torch.testing.assert_close(same, expected)


def test_gates_start_at_afs_bias():
    attention = ConditionedAttention(8, 8, 4, 2, kernels="torch")
    assert (attention.output_gate.bias == GATE_BIAS_INIT).all() and (attention.output_gate.weight == 0).all()


@pytest.mark.parametrize(
    "num_atoms, real_atoms, queries, keys",
    [
        (45, 38, 8, 24),  # not a multiple of the window, padding atoms
        (70, 61, 32, 128),  # AF3's windows, more keys than atoms
    ],
)
def test_window_kernels_match_the_torch_path_with_the_same_parameters(num_atoms, real_atoms, queries, keys):
    """kernels="triton" (window_attention) against kernels="torch" (padded evo_attention reference):
    same state_dict, same output, same gradient for every parameter and input."""
    generator = torch.Generator().manual_seed(num_atoms)
    c_a, c_s, c_pair, heads, samples = 16, 8, 4, 2, 3
    torch_path = ConditionedAttention(c_a, c_s, c_pair, heads, kernels="torch")
    for parameter in torch_path.parameters():
        parameter.data.normal_(generator=generator).mul_(0.5)
    triton_path = ConditionedAttention(c_a, c_s, c_pair, heads, kernels="triton")
    triton_path.load_state_dict(torch_path.state_dict())
    windows = AtomWindows(torch.arange(num_atoms)[None, :] < real_atoms, queries, keys)
    a = torch.randn(1, samples, num_atoms, c_a, generator=generator)
    s = torch.randn(1, 1, num_atoms, c_s, generator=generator)
    pair = torch.randn(1, windows.num_windows, queries, keys, c_pair, generator=generator)
    grad_out = torch.randn(1, samples, num_atoms, c_a, generator=generator)
    results = []
    for module in (torch_path, triton_path):
        inputs = [x.clone().requires_grad_() for x in (a, s, pair)]
        module(*inputs, windows).backward(grad_out)
        grads = [x.grad for x in inputs] + [p.grad for p in module.parameters() if p.requires_grad]
        results.append([module(*inputs, windows).detach()] + grads)
    for index, (want, got) in enumerate(zip(*results)):
        error = (got - want).abs().max().item()
        assert error <= 2e-5 * (1 + want.abs().max().item()), f"result {index}: max error {error:.2e}"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_token_pairs_of_windows_gather_each_atom_pairs_tokens(dtype):
    """The products' path (16-bit, with gradient) and the gather (fp32) against indices read one
    by one: the same values bit for bit, and each token pair's gradient the sum over its atom
    pairs. The products round twice: each query atom's sum over a key token's atoms in its
    window, then the total over query atoms (accumulated in fp32 both times), so the bound is eps x
    (the |partial sums| + |total|); the fp32 gather rounds each addition: fp32's summation
    tolerance."""
    generator = torch.Generator().manual_seed(5)
    batch, tokens, channels, atoms, queries, keys = 2, 23, 5, 101, 8, 32
    pad = torch.ones(batch, atoms, dtype=torch.bool)
    pad[1, 90:] = False
    atom_to_token = torch.sort(torch.randint(0, tokens, (batch, atoms), generator=generator), dim=1).values
    atom_to_token[1, 90:] = 0  # padding atoms point to token 0
    windows = AtomWindows(pad, queries=queries, keys=keys)
    token_pair = torch.randn(batch, tokens, tokens, channels, generator=generator).to(dtype).requires_grad_()
    pairs = windows.token_pairs_of(token_pair, atom_to_token)
    assert pairs.shape == (batch, windows.num_windows, queries, keys, channels)
    grad = torch.randn(pairs.shape, generator=generator).to(dtype)
    pairs.backward(grad)
    # per query atom (window w, position q) and token pair, the sum over its key atoms, in fp64
    partial = torch.zeros(batch, windows.num_windows, queries, tokens, tokens, channels, dtype=torch.float64)
    for b in range(batch):
        for w in range(windows.num_windows):
            for q in range(queries):
                query_atom = w * queries + q
                query_token = atom_to_token[b, query_atom] if query_atom < atoms else 0
                for k in range(keys):
                    key_atom = w * queries - (keys - queries) // 2 + k
                    key_token = atom_to_token[b, key_atom] if 0 <= key_atom < atoms else 0
                    assert torch.equal(pairs[b, w, q, k], token_pair[b, query_token, key_token])
                    partial[b, w, q, query_token, key_token] += grad[b, w, q, k].double()
    expected = partial.sum((1, 2))
    error = (token_pair.grad.double() - expected).abs()
    if dtype == torch.float32:
        bound = summation_tolerance(dtype, queries * keys) * partial.abs().sum((1, 2)).clamp(min=1.0)
    else:
        bound = torch.finfo(dtype).eps * (partial.abs().sum((1, 2)) + expected.abs())
    assert torch.all(error <= bound), (error - bound).max()
