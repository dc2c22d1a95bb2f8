"""Atom attention (AF3 Algorithms 5-7): the encoder from per-atom reference features (and, in the
diffusion module, noisy positions and the trunk) to tokens, the decoder back to atoms, and the
sequence-local atom transformer between them.

Symbols: c_l (`atom_cond`, the atom single conditioning), q_l (`atom_single`, the stream the atom
transformer updates), p_lm (`atom_pair`, kept only inside the local windows), a_i (token single),
r_l (noisy positions, scaled by c_in). Atoms are in record order (token by token), A of them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from featurecache.kernels.layernorm_linear import LayerNormLinear
from featurecache.kernels.reference import window_attention_reference
from featurecache.kernels.window_attention import window_attention
from featurecache.model.config import ModelConfig
from featurecache.model.network.atoms import gather_tokens, mean_over_token_atoms
from featurecache.model.network.layers import Linear, freeze_norm_bias, full_precision, kernel_module
from featurecache.model.network.transformer import ConditionedTransformer

NUM_ELEMENTS = 128  # one-hot of the atomic number (ref_element)
NAME_CHARS = 4  # ref_atom_name_chars: 4 characters ...
NAME_CHAR_CLASSES = 64  # ... each ord(c) - 32, one-hot over 64
REFERENCE_FEATURE_DIM = 3 + 1 + 1 + NUM_ELEMENTS + NAME_CHARS * NAME_CHAR_CLASSES  # 389

# What the atom encoder reads from a collated batch (featurecache.schema, loader.collate).
ATOM_INPUTS = (
    "ref_pos",
    "ref_mask",
    "ref_element",
    "ref_charge",
    "ref_atom_name_chars",
    "ref_space_uid",
    "atom_to_token",
    "atom_pad_mask",
)


def reference_features(batch: dict, charge_arcsinh: bool = True) -> torch.Tensor:
    """[B, A, 389] fp32: ref_pos, ref_charge (through arcsinh with `charge_arcsinh`, as AF3's
    code: a charge of 2 or 3 stays near 1's scale), ref_mask, one-hot element and atom-name
    characters (Algorithm 5, line 1)."""
    element = batch["ref_element"].long().clamp(0, NUM_ELEMENTS - 1)
    name = batch["ref_atom_name_chars"].long().clamp(0, NAME_CHAR_CLASSES - 1)
    charge = batch["ref_charge"].float()
    return torch.cat(
        [
            batch["ref_pos"].float(),
            (torch.asinh(charge) if charge_arcsinh else charge).unsqueeze(-1),
            batch["ref_mask"].float().unsqueeze(-1),
            F.one_hot(element, NUM_ELEMENTS).float(),
            F.one_hot(name, NAME_CHAR_CLASSES).flatten(-2).float(),
        ],
        dim=-1,
    )


class AtomWindows:
    """Sequence-local atom attention (Algorithm 7): atoms in windows of `queries` consecutive
    atoms (32), each attending to the `keys` atoms (128) centred on its window, as AF3's subset
    centres 15.5, 47.5, ... define them. Keys outside the atoms or padding are masked.

    Pair tensors live per window: [B, W, queries, keys, C]. kernels="triton" runs
    featurecache.kernels.window_attention on the windows as they are (queries x keys, the bias
    read once for a group of diffusion samples); kernels="torch" its PyTorch reference on the
    same layout.
    """

    def __init__(self, atom_pad_mask: torch.Tensor, queries: int = 32, keys: int = 128) -> None:
        batch_size, num_atoms = atom_pad_mask.shape
        device = atom_pad_mask.device
        self.queries, self.keys, self.num_atoms = queries, keys, num_atoms
        self.num_windows = max(1, -(-num_atoms // queries))
        window = torch.arange(self.num_windows, device=device)
        self.query_index = window[:, None] * queries + torch.arange(queries, device=device)  # [W, queries]
        key_index = window[:, None] * queries + (queries - keys) // 2 + torch.arange(keys, device=device)
        inside = (key_index >= 0) & (key_index < num_atoms)
        self.key_index = key_index.clamp(0, max(num_atoms - 1, 0))  # [W, keys]
        self.key_mask = inside & atom_pad_mask[:, self.key_index]  # [B, W, keys]

    def queries_of(self, atom_values: torch.Tensor) -> torch.Tensor:
        """[B, ..., A, C] -> [B, ..., W, queries, C] (zeros past the last atom)."""
        padded = F.pad(atom_values, (0, 0, 0, self.num_windows * self.queries - self.num_atoms))
        return padded.unflatten(-2, (self.num_windows, self.queries))

    def keys_of(self, atom_values: torch.Tensor) -> torch.Tensor:
        """[B, ..., A, C] -> [B, ..., W, keys, C] (zeros outside the atoms, where key_mask is
        False): a strided view of the zero-padded atoms, window w starting at atom
        w * queries - (keys - queries) / 2. Not a gather: a gather's backward on a GPU sorts its
        indices to sum each atom's up to keys / queries copies (~0.7 ms a call at 3,300 atoms),
        an unfold's adds them in place."""
        before = (self.keys - self.queries) // 2
        after = (self.num_windows - 1) * self.queries + self.keys - before - self.num_atoms
        padded = F.pad(atom_values, (0, 0, before, max(after, 0)))
        return padded.unfold(-2, self.keys, self.queries).transpose(-1, -2)

    def token_pairs_of(self, token_pair: torch.Tensor, atom_to_token: torch.Tensor) -> torch.Tensor:
        """[B, N, N, C] -> [B, W, queries, keys, C]: each (query atom, key atom)'s token pair (token 0
        for the keys outside the atoms).

        Where autograd records a 16-bit token_pair, as two products with one-hot selections:
        each output sums one term in fp32, so the values are the gather's exactly, and the
        gradient sums each token pair's atom pairs by matrix products in a fixed order. An
        advanced-indexing gather's backward sorts its ~400k indices (W x queries x keys) to sum
        duplicates: one kernel of 6.3 ms a step on an H100 at 3,328 atoms, 15 % of the tiny
        step's kernel time, gone from its profile with the products (~60 GFLOP forward and
        backward; benchmarks/NOTES.md section 20)."""
        token = atom_to_token.unsqueeze(-1).float()
        query_token = self.queries_of(token).squeeze(-1).long()  # [B, W, Q]
        key_token = self.keys_of(token).squeeze(-1).long()  # [B, W, K]
        if not (torch.is_grad_enabled() and token_pair.requires_grad and token_pair.element_size() == 2):
            rows = torch.arange(token_pair.shape[0], device=token_pair.device)[:, None, None, None]
            return token_pair[rows, query_token[..., :, None], key_token[..., None, :]]
        batch, num_tokens, _, channels = token_pair.shape
        windows, queries, keys = self.num_windows, self.queries, self.keys
        with torch.autocast(token_pair.device.type, enabled=False):  # the products in token_pair's dtype
            tokens = torch.arange(num_tokens, device=token_pair.device)
            pick_rows = (query_token.flatten(1, 2)[..., None] == tokens).to(token_pair.dtype)  # [B, W * Q, N]
            pick_keys = (key_token[..., None] == tokens).to(token_pair.dtype)  # [B, W, K, N]
            # each query atom's token row [B, W * Q, N * C], then per window the keys' columns
            rows = torch.bmm(pick_rows, token_pair.reshape(batch, num_tokens, num_tokens * channels))
            rows = rows.view(batch, windows, queries, num_tokens, channels).transpose(2, 3)
            pairs = torch.matmul(pick_keys, rows.reshape(batch, windows, num_tokens, queries * channels))
        return pairs.view(batch, windows, keys, queries, channels).transpose(2, 3)  # [B, W, Q, K, C]

    def attention_bias(self, pair_bias: torch.Tensor, kernels: str) -> torch.Tensor:
        """[B, W, queries, keys, H] -> the windowed attention's bias [B, W, H, queries, keys]
        (contiguous keys: the kernels read [queries, keys] tiles in whole cache lines); the same
        layout for both kernel paths."""
        return pair_bias.permute(0, 1, 4, 2, 3).contiguous()

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, kernels: str
    ) -> torch.Tensor:
        """Each window's queries over its keys: q, k, v [B, S, A, H, D], bias from attention_bias
        -> [B, S, A, H, D]."""
        heads = q.shape[-2:]
        q_windows = self.queries_of(q.flatten(-2)).unflatten(-1, heads)  # [B, S, W, queries, H, D]
        k_windows, v_windows = (self.keys_of(t.flatten(-2)).unflatten(-1, heads) for t in (k, v))
        attention = window_attention_reference if kernels == "torch" else window_attention
        out = attention(q_windows, k_windows, v_windows, bias=bias, mask=self.key_mask)
        return out.flatten(2, 3)[:, :, : self.num_atoms]


class AtomTransformer(nn.Module):
    """Algorithm 7: the conditioned transformer over atoms with sequence-local attention, of
    `num_blocks` blocks (default config.atom_attention.atom_blocks)."""

    def __init__(self, config: ModelConfig, num_blocks: int | None = None) -> None:
        super().__init__()
        atom = config.atom_attention
        num_blocks = atom.atom_blocks if num_blocks is None else num_blocks
        self.transformer = ConditionedTransformer(
            atom.c_atom,
            atom.c_atom,
            atom.c_atompair,
            num_blocks,
            atom.atom_heads,
            config.runtime.kernels,
            checkpoint_blocks=config.runtime.checkpoint_blocks,
            key_adaln=atom.atom_key_adaln,
            key_adaln_nested=config.dialect.atom_key_adaln_nested,
        )

    def forward(
        self, atom_single, atom_cond, atom_pair, windows: AtomWindows, biases=None, conditioning=None
    ) -> torch.Tensor:
        """atom_single [B, S, A, c_atom], atom_cond [B, 1, A, c_atom], atom_pair [B, W, Q, K, c_atompair];
        biases: attention_biases(atom_pair, windows), and conditioning: conditioning(atom_cond), if
        already computed."""
        return self.transformer(atom_single, atom_cond, atom_pair, windows, biases, conditioning)

    def conditioning(self, atom_cond: torch.Tensor) -> list:
        """Each block's s side from the atom conditioning c_l alone (shared by a sampler's steps)."""
        return self.transformer.conditioning(atom_cond)

    def attention_biases(self, atom_pair: torch.Tensor, windows: AtomWindows) -> list[torch.Tensor]:
        """Each block's attention bias, a function of the atom pair alone (shared by a sampler's steps)."""
        return self.transformer.attention_biases(atom_pair, windows)


class AtomAttentionEncoder(nn.Module):
    """Algorithm 5, AtomAttentionEncoder. `with_trunk` builds the diffusion module's version,
    which also reads the trunk's single and pair and the noisy positions. `num_blocks`: its atom
    transformer's (default config.atom_attention.atom_blocks)."""

    def __init__(self, config: ModelConfig, c_token: int, with_trunk: bool, num_blocks: int | None = None) -> None:
        super().__init__()
        c_atom, c_pair = config.atom_attention.c_atom, config.atom_attention.c_atompair
        self.with_trunk = with_trunk
        self.coordinates_fp32 = config.diffusion.diffusion_coordinates_fp32
        self.charge_arcsinh = config.atom_attention.ref_charge_arcsinh
        self.cond_ref_mask = config.atom_attention.atom_cond_ref_mask
        self.from_reference = Linear(REFERENCE_FEATURE_DIM, c_atom, bias=False)
        self.pair_from_offset = Linear(3, c_pair, bias=False)
        self.pair_from_distance = Linear(1, c_pair, bias=False)
        self.pair_from_same_space = Linear(1, c_pair, bias=False)
        if with_trunk:
            self.from_trunk_single = kernel_module(
                LayerNormLinear, config.trunk.c_s, c_atom, bias=False, kernels=config.runtime.kernels
            )
            self.from_trunk_pair = kernel_module(
                LayerNormLinear, config.trunk.c_z, c_pair, bias=False, kernels=config.runtime.kernels
            )
            self.from_positions = Linear(3, c_atom, bias=False)
        self.pair_from_query = Linear(c_atom, c_pair, bias=False)
        self.pair_from_key = Linear(c_atom, c_pair, bias=False)
        self.pair_mlp = nn.Sequential(
            nn.ReLU(),
            Linear(c_pair, c_pair, bias=False),
            nn.ReLU(),
            Linear(c_pair, c_pair, bias=False),
            nn.ReLU(),
            Linear(c_pair, c_pair, bias=False),
        )
        self.atom_transformer = AtomTransformer(config, num_blocks)
        self.to_token = Linear(c_atom, c_token, bias=False)

    def condition(
        self,
        batch: dict,
        windows: AtomWindows,
        trunk_single: torch.Tensor | None = None,
        trunk_pair: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """c_l [B, 1, A, c_atom] and p_lm [B, W, Q, K, c_atompair] (Algorithm 5, lines 1-13 but
        11): everything that does not depend on the noisy positions, computed once per trunk pass.

        With config.diffusion.diffusion_coordinates_fp32 the projections of the reference positions
        and their offsets run in fp32 under autocast (small: [A, 389] and [W, Q, K, 3] inputs)."""
        ref_pos = batch["ref_pos"].float()
        uid = batch["ref_space_uid"].unsqueeze(-1).float()
        with full_precision(self.coordinates_fp32, ref_pos.device.type):
            atom_cond = self.from_reference(reference_features(batch, self.charge_arcsinh))  # [B, A, c_atom]
            offset = windows.queries_of(ref_pos)[..., :, None, :] - windows.keys_of(ref_pos)[..., None, :, :]
            same_space = (windows.queries_of(uid)[..., :, None, :] == windows.keys_of(uid)[..., None, :, :]).float()
            atom_pair = (
                self.pair_from_offset(offset)
                + self.pair_from_distance(1.0 / (1.0 + offset.square().sum(-1, keepdim=True)))
                + self.pair_from_same_space(same_space)
            ) * same_space  # [B, W, Q, K, c_atompair]
        if self.cond_ref_mask:  # AF3's code: an atom without reference features conditions nothing
            atom_cond = atom_cond * batch["ref_mask"].unsqueeze(-1).to(atom_cond.dtype)
        if self.with_trunk:
            atom_to_token = batch["atom_to_token"]
            atom_cond = atom_cond + gather_tokens(self.from_trunk_single(trunk_single), atom_to_token)
            token_pair = self.from_trunk_pair(trunk_pair)  # [B, N, N, c_atompair]: project, then gather
            atom_pair = atom_pair + windows.token_pairs_of(token_pair, atom_to_token)
        relu_cond = torch.relu(atom_cond)
        atom_pair = (
            atom_pair
            + windows.queries_of(self.pair_from_query(relu_cond))[..., :, None, :]
            + windows.keys_of(self.pair_from_key(relu_cond))[..., None, :, :]
        )
        atom_pair = atom_pair + self.pair_mlp(atom_pair)
        return atom_cond.unsqueeze(1), atom_pair

    def forward(
        self,
        batch: dict,
        windows: AtomWindows,
        atom_cond: torch.Tensor,
        atom_pair: torch.Tensor,
        scaled_positions: torch.Tensor | None = None,
        biases: list[torch.Tensor] | None = None,
        conditioning: list | None = None,
    ):
        """Algorithm 5 lines 7, 11, 14-17. scaled_positions [B, S, A, 3] (r_l) or None; biases: the
        atom transformer's attention_biases(atom_pair, windows), and conditioning: its
        conditioning(atom_cond), if already computed.

        Returns the token single a [B, S, N, c_token] and the skips q_l [B, S, A, c_atom], c_l, p_lm.
        With config.diffusion.diffusion_coordinates_fp32 r_l's projection runs in fp32 under autocast,
        and so does q_l's sum with it (the atom transformer's layers then cast to bf16 themselves).
        """
        atom_single = atom_cond
        if scaled_positions is not None:
            with full_precision(self.coordinates_fp32, scaled_positions.device.type):
                if self.coordinates_fp32:
                    scaled_positions = scaled_positions.float()
                atom_single = atom_single + self.from_positions(scaled_positions)
        atom_single = self.atom_transformer(atom_single, atom_cond, atom_pair, windows, biases, conditioning)
        num_tokens = batch["restype"].shape[1]
        token_single = mean_over_token_atoms(
            torch.relu(self.to_token(atom_single)), batch["atom_to_token"], batch["atom_pad_mask"], num_tokens
        )
        return token_single, atom_single, atom_cond, atom_pair


class AtomAttentionDecoder(nn.Module):
    """Algorithm 6, AtomAttentionDecoder: tokens back to atoms, the atom transformer, positions."""

    def __init__(self, config: ModelConfig, c_token: int) -> None:
        super().__init__()
        self.from_token = Linear(c_token, config.atom_attention.c_atom, bias=False)
        self.atom_transformer = AtomTransformer(config)
        self.to_positions = kernel_module(
            LayerNormLinear, config.atom_attention.c_atom, 3, bias=False, kernels=config.runtime.kernels
        )
        freeze_norm_bias(self.to_positions)  # a translation of every atom: the losses ignore it
        self.coordinates_fp32 = config.diffusion.diffusion_coordinates_fp32

    def forward(
        self,
        batch: dict,
        windows: AtomWindows,
        token_single: torch.Tensor,
        atom_single: torch.Tensor,
        atom_cond: torch.Tensor,
        atom_pair: torch.Tensor,
        biases: list[torch.Tensor] | None = None,
        conditioning: list | None = None,
    ) -> torch.Tensor:
        """token_single [B, S, N, c_token] and the encoder's skips -> position update [B, S, A, 3].
        biases: the atom transformer's attention_biases(atom_pair, windows), and conditioning: its
        conditioning(atom_cond), if already computed."""
        atom_single = gather_tokens(self.from_token(token_single), batch["atom_to_token"]) + atom_single
        atom_single = self.atom_transformer(atom_single, atom_cond, atom_pair, windows, biases, conditioning)
        if not self.coordinates_fp32:
            return self.to_positions(atom_single)
        # fp32 update (its LayerNorm and [c_atom, 3] product): bf16 would round it to 8 bits
        with full_precision(True, atom_single.device.type):
            return self.to_positions(atom_single.float())
