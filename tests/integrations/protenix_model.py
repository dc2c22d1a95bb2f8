"""Protenix 2.0's own model, loss and permutation at small sizes on the CPU, and its trainer's
step (runner/train.py: model_forward, get_loss, backward) on one example: what tests/integrations
train on examples from the cache."""

from __future__ import annotations

import copy
import random

import torch

from featurecache.testing.protenix import randomise

# Keys Protenix's model reads with .get / `in` that its own pipeline does not give a training
# example either (constraints, ESM embeddings, and names its logging looks up).
OPTIONAL_KEYS = {"constraint_feature", "esm_token_embedding", "dataset_name", "pdb_id"}


class Reads(dict):
    """A feature dict that remembers every key looked up in it that it does not hold."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.missing: set[str] = set()

    def __getitem__(self, key):
        if key not in self:
            self.missing.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        if not super().__contains__(key):
            self.missing.add(key)
        return super().get(key, default)

    def __contains__(self, key):
        present = super().__contains__(key)
        if not present:
            self.missing.add(key)
        return present


def small_protenix() -> dict:
    """Protenix's default model (its configs' protenix_base_default_v1.0.0) at small widths and
    one block per stack, fp32 on the CPU, random weights (its zero-initialised heads would make
    every confidence and distogram loss a constant), its bond and PAE losses switched on."""
    from configs.configs_base import configs as base_configs
    from configs.configs_data import data_configs
    from configs.configs_model_type import model_configs
    from protenix.config import parse_configs
    from protenix.model.loss import ProtenixLoss
    from protenix.model.protenix import Protenix
    from protenix.utils.permutation.permutation import SymmetricPermutation

    def update(target: dict, changes: dict) -> dict:
        for key, value in changes.items():
            if isinstance(value, dict) and isinstance(target.get(key), dict):
                update(target[key], value)
            else:
                target[key] = value
        return target

    config = copy.deepcopy({**base_configs, "data": data_configs})
    update(config, copy.deepcopy(model_configs["protenix_base_default_v1.0.0"]))
    one_block = {"n_blocks": 1}
    update(
        config,
        {
            "c_s": 64,
            "c_z": 32,
            "c_token": 64,
            "c_s_inputs": 64 + 32 + 32 + 1,
            "c_atom": 32,
            "c_atompair": 8,
            "n_blocks": 1,
            "diffusion_batch_size": 2,
            "dtype": "fp32",
            "use_wandb": False,
            "triangle_multiplicative": "torch",
            "triangle_attention": "torch",
            "sample_diffusion": {"N_step_mini_rollout": 2},
            "loss": {"weight": {"alpha_bond": 1.0, "alpha_pae": 1.0}},
            "model": {
                "N_cycle": 1,
                "template_embedder": {"n_blocks": 1, "c": 16},
                "msa_module": {"n_blocks": 1, "c_m": 16},
                "confidence_head": one_block,
                "diffusion_module": {
                    "c_token": 64,
                    "atom_encoder": one_block,
                    "transformer": one_block,
                    "atom_decoder": one_block,
                },
            },
        },
    )
    config = parse_configs(config, arg_str="", fill_required_with_null=True)
    torch.manual_seed(0)
    model = Protenix(config)
    randomise(model, torch.Generator().manual_seed(20261204))
    model.train()
    return {"model": model, "loss": ProtenixLoss(config), "permutation": SymmetricPermutation(config)}


def train_step(protenix_model: dict, example: dict, step: int) -> tuple[dict, set[str]]:
    """Protenix's trainer's step on one example (runner/train.py: model_forward, get_loss,
    backward): its loss terms and the feature keys it looked up and did not find."""
    features = Reads(example["input_feature_dict"])
    labels = dict(example["label_dict"])
    random.seed(step)  # its embedding-drop draws
    predictions, labels, _ = protenix_model["model"](
        input_feature_dict=features,
        label_dict=labels,
        label_full_dict=example["label_full_dict"],
        mode="train",
        current_step=step,
        symmetric_permutation=protenix_model["permutation"],
        mc_dropout_apply_rate=0,
    )
    loss, terms = protenix_model["loss"](feat_dict=features, pred_dict=predictions, label_dict=labels, mode="train")
    protenix_model["model"].zero_grad(set_to_none=True)
    loss.backward()
    gradients = [p.grad for p in protenix_model["model"].parameters() if p.grad is not None]
    assert gradients and all(torch.isfinite(g).all() for g in gradients)
    return {name: float(value) for name, value in terms.items()}, features.missing
