from featurecache.config import FeatureConfig, fingerprint, stable_hash


def test_fingerprint_is_stable_and_sensitive():
    assert fingerprint(FeatureConfig(), "v1") == fingerprint(FeatureConfig(), "v1")
    assert fingerprint(FeatureConfig(), "v1") != fingerprint(FeatureConfig(max_msa_rows=8), "v1")
    assert stable_hash({"a": 1, "b": 2}) == stable_hash({"b": 2, "a": 1})
