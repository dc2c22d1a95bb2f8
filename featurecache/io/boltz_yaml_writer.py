"""Boltz's input YAML (its docs/prediction.md, schema version 1; read by boltz.data.parse.schema),
from the same entities as the AlphaFold 3 JSON (io/af3_json_writer.py).

    version: 1
    sequences:
      - protein:
          id: [A, B]
          sequence: "MTEYK..."
          msa: "/abs/path/boltz_msa.csv"      # or "empty": no MSA (single-sequence mode)
          modifications:
            - position: 5                     # 1-based
              ccd: "MSE"
      - ligand:
          id: [C]
          ccd: ["NAG", "NAG"]                 # one residue per code; or smiles: "..."
    constraints:
      - bond:
          atom1: ["A", 12, "ND2"]             # chain, 1-based residue, atom name
          atom2: ["C", 1, "C1"]

Boltz refuses an input mixing proteins with and without `msa` ("Cannot mix custom and
auto-generated MSAs"), and without one it searches a server: so every protein gets its CSV or
"empty". Boltz merges entities of the same type and sequence whatever their modifications (it
keeps the first one's), so a chain whose copies differ in modifications is not expressible there.

Values are written as JSON scalars and flow lists, which YAML reads as written (no PyYAML needed).
"""

from __future__ import annotations

import json

from featurecache.io.af3_json_writer import Af3Entity

EMPTY_MSA = "empty"


def _entity_lines(entity: Af3Entity, msa: str | None) -> list[str]:
    lines = [f"  - {entity.kind}:", f"      id: {json.dumps(list(entity.ids))}"]
    if entity.kind == "ligand":
        if entity.smiles:
            lines.append(f"      smiles: {json.dumps(entity.smiles)}")
        else:
            codes = entity.ccd_codes
            lines.append(f"      ccd: {json.dumps(codes[0] if len(codes) == 1 else list(codes))}")
        return lines
    lines.append(f"      sequence: {json.dumps(entity.sequence)}")
    if entity.kind == "protein":
        lines.append(f"      msa: {json.dumps(msa or EMPTY_MSA)}")
    if entity.modifications:
        lines.append("      modifications:")
        for code, position in entity.modifications:
            lines += [f"        - position: {position}", f"          ccd: {json.dumps(code)}"]
    return lines


def boltz_yaml_text(
    entities: list[Af3Entity], bonds: list[list[list]] | None = None, msas: dict[int, str] | None = None
) -> str:
    """The input file's text. `bonds`: AF3's `bondedAtomPairs` ([chain id, 1-based residue,
    atom] pairs; Boltz uses the same chain ids); `msas`: entity index -> its MSA file (Boltz CSV
    or A3M, absolute path)."""
    lines = ["version: 1", "sequences:"]
    for index, entity in enumerate(entities):
        lines += _entity_lines(entity, (msas or {}).get(index))
    if bonds:
        lines.append("constraints:")
        for first, second in bonds:
            lines += ["  - bond:", f"      atom1: {json.dumps(first)}", f"      atom2: {json.dumps(second)}"]
    return "\n".join(lines) + "\n"
