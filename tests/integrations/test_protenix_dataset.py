"""The cache as Protenix's data source (featurecache.integrations.protenix.ProtenixDataset).

Protenix's own model (train mode: mini-rollout, permutation, confidence head, diffusion batch)
and loss run on examples from the adapter for a protein-ligand (721p), a protein-DNA (2q2k) and a
multimer (7a4d) target of the sample cache, at small sizes in fp32 with random weights; every
feature Protenix declares (protenix/data/utils.py get_data_shape_dict, read from its source) is
there with its shape, and the values are checked against the featurecache sample they come from
and, where Protenix defines them, by hand.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import math
import pathlib

import numpy as np
import pytest
import torch

from featurecache.schema import GAP, RESTYPES
from featurecache.testing.protenix import import_protenix
from tests.integrations.protenix_model import OPTIONAL_KEYS, Reads, train_step

CROP = 48
TARGETS = {"721p-assembly1": "protein-ligand", "2q2k": "protein-DNA", "7a4d-assembly1": "multimer"}


@pytest.fixture(scope="module", autouse=True)
def _protenix():
    """Protenix missing fails these tests with the fix in the message (./setup.sh installs it)."""
    import_protenix()


def protenix_shapes(num_token: int, num_atom: int, num_msa: int, num_templ: int) -> tuple[dict, dict]:
    """Protenix's get_data_shape_dict, executed from its source: protenix/data/utils.py imports
    pandas, which Protenix's model does not need and this environment does not install."""
    from protenix import data

    source = pathlib.Path(inspect.getfile(data)).with_name("utils.py")
    tree = ast.parse(source.read_text())
    function = next(
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "get_data_shape_dict"
    )
    namespace: dict = {}
    exec(compile(ast.Module(body=[function], type_ignores=[]), str(source), "exec"), namespace)  # noqa: S102 - its own source
    return namespace["get_data_shape_dict"](num_token, num_atom, num_msa, num_templ, 30)


@pytest.fixture(scope="module")
def dataset(sample_cache):
    from featurecache.integrations.protenix import ProtenixDataset

    return ProtenixDataset(sample_cache, crop_size=CROP, msa_rows_per_sample=16, seed=3)


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_protenix_trains_on_examples_from_the_cache(target, dataset, protenix_model):
    example = dataset[dataset.ids.index(target)]
    features = example["input_feature_dict"]
    num_token, num_atom = len(features["token_index"]), len(features["atom_to_token_idx"])
    assert num_token == CROP  # every target is larger than the crop
    feature_shapes, label_shapes = protenix_shapes(num_token, num_atom, len(features["msa"]), 4)
    # its dataset's features: the declared ones but the dummies it gives only without templates
    # (template_restype, template_all_atom_*) and the pocket labels of its evaluation sets
    declared = {
        name: shape
        for name, shape in feature_shapes.items()
        if name not in ("template_restype", "template_all_atom_mask", "template_all_atom_positions")
    }
    # the table's two template masks are [T, N]; its template featurizer (Templates.as_protenix_dict)
    # gives pair masks, which its template embedder multiplies with [N, N] chain masks
    for name in ("template_pseudo_beta_mask", "template_backbone_frame_mask"):
        declared[name] = (4, num_token, num_token)
    for name, shape in declared.items():
        assert name in features, name
        assert tuple(features[name].shape) == shape, (name, tuple(features[name].shape), shape)
    for name in ("coordinate", "coordinate_mask"):
        assert tuple(example["label_dict"][name].shape) == label_shapes[name]
    for name in ("has_frame", "frame_atom_index"):  # labels in its table, features in its pipeline
        assert tuple(features[name].shape) == label_shapes[name]
    assert len(features["atom_perm_list"]) == num_atom

    terms, missing = train_step(protenix_model, example, step=1)
    assert missing <= OPTIONAL_KEYS, f"Protenix looked up {sorted(missing - OPTIONAL_KEYS)}"
    assert all(math.isfinite(value) for value in terms.values()), terms
    for name in (
        "mse_loss",
        "smooth_lddt_loss",
        "distogram_loss",
        "plddt_loss",
        "pae_loss",
        "pde_loss",
        "resolved_loss",
    ):
        assert terms[name] > 0, (name, terms)


def test_features_are_the_samples_in_protenixs_layout(dataset):
    """Every value against the featurecache sample it was made from (the same crop: the loader
    draws it from (seed, epoch, index)), in Protenix's encodings."""
    index = dataset.ids.index("721p-assembly1")
    sample = dataset.cache[index]
    features = dataset[index]["input_feature_dict"]
    atom_to_token = sample["atom_to_token"]
    assert torch.equal(features["restype"].argmax(-1), sample["restype"])
    assert torch.equal(features["restype"].sum(-1), torch.ones(CROP))
    assert torch.equal(features["token_index"], torch.arange(CROP))
    for name in ("asym_id", "entity_id", "sym_id"):  # Protenix numbers them from 0
        assert torch.equal(features[name], sample[name] - 1)
    assert torch.equal(features["residue_index"], sample["residue_index"])
    assert torch.equal(features["atom_to_token_idx"], atom_to_token)
    for kind in ("protein", "rna", "dna", "ligand"):  # per atom in Protenix
        assert torch.equal(features[f"is_{kind}"], sample[f"is_{kind}"][atom_to_token].long())
    assert torch.equal(features["ref_element"].argmax(-1) + 1, sample["ref_element"])
    assert torch.equal(features["ref_atom_name_chars"].argmax(-1), sample["ref_atom_name_chars"])
    assert torch.equal(features["ref_pos"], sample["ref_pos"])
    assert torch.equal(example_tokens_with_bonds(features), bonded_tokens(sample))
    # one centre, one distogram atom per token; pLDDT atoms on standard residues only
    single = torch.bincount(atom_to_token, minlength=CROP) == 1
    assert torch.equal(
        torch.bincount(atom_to_token[features["pae_rep_atom_mask"].bool()], minlength=CROP),
        torch.ones(CROP, dtype=torch.long),
    )
    assert features["distogram_rep_atom_mask"].sum() == CROP
    assert features["plddt_m_rep_atom_mask"].sum() == int((~single).sum())
    centres = features["pae_rep_atom_mask"].bool()
    resolved = sample["token_center_mask"]
    assert torch.equal(sample["atom_pos"][centres][resolved], sample["token_center_pos"][resolved])
    distogram_atoms = torch.nonzero(features["distogram_rep_atom_mask"]).flatten()
    assert torch.equal(distogram_atoms, sample["distogram_atom_index"].sort().values)
    # the MSA as drawn, deletions as Protenix encodes them
    assert torch.equal(features["msa"], sample["msa"])
    assert torch.equal(features["has_deletion"], (sample["deletion_matrix"] > 0).float())
    assert torch.allclose(features["deletion_value"], torch.atan(sample["deletion_matrix"] / 3) * 2 / math.pi)
    assert torch.equal(features["profile"], sample["msa_profile"])
    labels = dataset[index]["label_dict"]
    assert torch.equal(labels["coordinate"], sample["atom_pos"])
    assert torch.equal(labels["coordinate_mask"], sample["atom_mask"].long())
    assert features["resolution"].tolist() == [2.0]  # 721P's resolution
    # no templates stored for these targets: Protenix's four empty rows
    assert torch.all(features["template_aatype"] == GAP) and not features["template_atom_mask"].any()


def example_tokens_with_bonds(features: dict) -> torch.Tensor:
    return torch.nonzero(features["token_bonds"].sum(-1)).flatten()


def bonded_tokens(sample: dict) -> torch.Tensor:
    return torch.unique(sample["token_bonds"].reshape(-1))


def test_atom_permutations_are_per_residue_with_the_identity_first(dataset):
    example = dataset[dataset.ids.index("721p-assembly1")]
    features = example["input_feature_dict"]
    uid = features["ref_space_uid"]
    starts = torch.nonzero(torch.cat([torch.tensor([True]), uid[1:] != uid[:-1]])).flatten().tolist() + [len(uid)]
    swapped = 0
    for start, end in itertools.pairwise(starts):
        rows = features["atom_perm_list"][start:end]
        assert len({len(row) for row in rows}) == 1  # one column per relabelling of the residue
        columns = np.array(rows).T
        assert columns[0].tolist() == list(range(end - start))
        for column in columns:
            assert sorted(column.tolist()) == list(range(end - start))  # a permutation of the residue
        swapped += len(columns) - 1
    assert swapped > 0  # Asp/Glu/Phe/Tyr/Arg swaps and GNP's phosphate oxygens in the crop


def test_molecules_and_full_labels_cover_every_copy(dataset):
    """721p: two copies of Ras + Mg + GNP, no covalent bond between chains: one molecule per
    chain; the full labels hold, for a spatial crop, the crop's atoms in every copy it touches."""
    from featurecache.integrations.protenix.features import molecule_ids

    record, _ = dataset.cache.load_arrays("721p-assembly1")
    molecules = molecule_ids(record)
    chain = record["asym_id"][record["atom_to_token"]]
    assert np.array_equal(molecules["mol_id"], chain - 1)
    # entity_mol_id: the two Ras chains share one, as do the two Mg and the two GNP
    entity = record["entity_id"][record["atom_to_token"]]
    for value in np.unique(entity):
        assert len(np.unique(molecules["entity_mol_id"][entity == value])) == 1
    assert len(np.unique(molecules["entity_mol_id"])) == len(np.unique(entity)) == 3
    for mol in np.unique(molecules["mol_id"]):
        assert np.array_equal(
            molecules["mol_atom_index"][molecules["mol_id"] == mol], np.arange((molecules["mol_id"] == mol).sum())
        )

    index = dataset.ids.index("721p-assembly1")
    example, crop_mode = dataset[index], dataset.cache[index]["crop_mode"]
    features, full = example["input_feature_dict"], example["label_full_dict"]
    cropped = set(zip(features["entity_mol_id"].tolist(), features["mol_atom_index"].tolist()))
    kept = set(zip(full["entity_mol_id"].tolist(), full["mol_atom_index"].tolist()))
    assert kept == cropped
    assert crop_mode.startswith("spatial")  # (seed 3's crop) Protenix keeps the touched molecules only
    assert set(full["mol_id"].tolist()) == set(features["mol_id"].tolist())
    assert len(full["coordinate"]) == len(features["atom_to_token_idx"])  # each copy's atoms once


def test_template_features_by_protenix_formulas(tmp_path_factory, shared_data, protenix_model):
    """OpenFold's 73-residue query with its HHR hits (templates whose structures are in the
    sample folder): the drawn templates in Protenix's rows, its distogram and unit vectors, and
    Protenix's template embedder training on them."""
    import shutil

    from featurecache.integrations.protenix import ProtenixDataset
    from featurecache.precompute.pipeline import PrecomputeOptions, precompute

    root = tmp_path_factory.mktemp("protenix-templates")
    openfold = shared_data / "alignments" / "openfold"
    (root / "inputs").mkdir()
    (root / "alignments" / "query").mkdir(parents=True)
    shutil.copy(openfold / "short.fasta", root / "inputs")
    for name in ("bfd_uniclust_hits.a3m", "pdb70_hits.hhr"):
        shutil.copy(openfold / name, root / "alignments" / "query")
    summary = precompute(
        PrecomputeOptions(
            inputs=[root / "inputs"],
            cache_dir=root / "cache",
            alignments_dir=root / "alignments",
            template_dir=shared_data / "templates" / "mmcif",
            num_workers=1,
            progress=False,
            executor="inline",
        )
    )
    assert summary.failed == 0, summary.format()
    dataset = ProtenixDataset(root / "cache", crop_size=None, max_templates=2, random_templates=False)
    from featurecache.integrations.protenix.features import protenix_example

    sample = dataset.cache[0]
    features = protenix_example(sample, dataset.cache.load_arrays(sample["id"])[0])["input_feature_dict"]
    restype = sample["template_restype"]
    assert restype.shape[0] == 2
    assert torch.equal(features["template_aatype"][:2], restype)
    assert torch.all(features["template_aatype"][2:] == GAP) and not features["template_atom_mask"][2:].any()
    # dense slots: N, CA, C at 0, 1, 2; CB at 4 (glycine: its CA)
    positions, present = features["template_atom_positions"], features["template_atom_mask"]
    backbone_present = sample["template_backbone_mask"]
    assert torch.equal(present[:2, :, :3], backbone_present)
    assert torch.equal(positions[:2, :, :3][backbone_present], sample["template_backbone_pos"][backbone_present])
    amino_acid = restype < RESTYPES.index("UNK")
    not_glycine = amino_acid & (restype != RESTYPES.index("GLY"))
    beta = sample["template_pseudo_beta_mask"] & not_glycine
    assert torch.equal(positions[:2, :, 4][beta], sample["template_pseudo_beta_pos"][beta])
    # the distogram: one bin per present pair, the bin whose squared edges hold the distance
    pair_present = features["template_pseudo_beta_mask"][0].bool()
    assert torch.equal(
        pair_present, sample["template_pseudo_beta_mask"][0][:, None] & sample["template_pseudo_beta_mask"][0][None, :]
    )
    # (Protenix's first lower edge is 3.25 A: a closer pair, a residue with itself, has no bin)
    distogram = features["template_distogram"][0]
    beta_positions = sample["template_pseudo_beta_pos"][0].double()
    distances = torch.cdist(beta_positions, beta_positions)
    binned = pair_present & (distances > 3.25)
    assert torch.equal(distogram.sum(-1)[binned], torch.ones(int(binned.sum())))
    assert not distogram[~binned].any()
    lower = torch.linspace(3.25, 50.75, 39, dtype=torch.float64)
    expected_bin = (lower[None, None, :] < distances[..., None]).sum(-1) - 1
    assert torch.equal(distogram.argmax(-1)[binned], expected_bin[binned])
    i, j = [int(k) for k in torch.nonzero(binned & features["template_backbone_frame_mask"][0].bool())[0]]
    # unit vectors: unit length where both frames are present, in the frame of residue i
    frames = features["template_backbone_frame_mask"][0].bool()
    assert frames.any()
    lengths = torch.linalg.norm(features["template_unit_vector"][0], dim=-1)
    off_diagonal = frames & ~torch.eye(len(frames), dtype=torch.bool)
    assert torch.allclose(lengths[off_diagonal], torch.ones(int(off_diagonal.sum())), atol=1e-4)
    # by hand for one pair: CA(i) -> CA(j) in the frame of i (x along C - CA, y towards N in the plane)
    n, ca, c = sample["template_backbone_pos"][0, i].double()
    axis_x = (c - ca) / torch.linalg.norm(c - ca)
    axis_y = (n - ca) - ((n - ca) @ axis_x) * axis_x
    axis_y = axis_y / torch.linalg.norm(axis_y)
    towards_j = sample["template_backbone_pos"][0, j, 1].double() - ca
    towards_j = towards_j / torch.linalg.norm(towards_j)
    expected = torch.stack([towards_j @ axis_x, towards_j @ axis_y, towards_j @ torch.linalg.cross(axis_x, axis_y)])
    # float32 arithmetic on coordinates of tens of Angstrom, relative error a few ulp
    assert torch.allclose(features["template_unit_vector"][0, i, j].double(), expected, atol=1e-5)

    # a FASTA target has no ground truth to train on: Protenix's trunk and template embedder
    # (which reads the four template pair features) run on it
    from protenix.model.protenix import update_input_feature_dict

    model = protenix_model["model"]
    inputs = Reads(features)
    update_input_feature_dict(model.relative_position_encoding.generate_relp(inputs))
    with torch.no_grad():
        _, single, pair = model.get_pairformer_output(input_feature_dict=inputs, N_cycle=1)
        templates = model.template_embedder(inputs, pair)
    assert inputs.missing <= OPTIONAL_KEYS, sorted(inputs.missing - OPTIONAL_KEYS)
    assert torch.isfinite(single).all() and torch.isfinite(pair).all() and torch.isfinite(templates).all()
    assert templates.abs().sum() > 0
    with pytest.raises(ValueError, match="short: no resolved atom in this sample"):  # the trainer is told so
        dataset[0]


def test_settings_protenix_cannot_take_are_refused(sample_cache, dataset):
    from featurecache.integrations.protenix import ProtenixDataset
    from featurecache.integrations.protenix.features import protenix_example

    for max_templates in (None, 5):
        with pytest.raises(ValueError, match="Protenix's template features hold 4 rows"):
            ProtenixDataset(sample_cache, max_templates=max_templates)
    sample = dataset.cache[dataset.ids.index("2q2k")]
    other_record, _ = dataset.cache.load_arrays("721p-assembly1")
    with pytest.raises(ValueError, match="does not match the record"):
        protenix_example(sample, other_record)
