

def test_probe_a_dir_that_is_a_link_to_its_storage(tmp_path):
    """A checkpoint dir linked to the storage that holds it (a mount elsewhere) is written through its link."""
    (tmp_path / "store").mkdir()
    (tmp_path / "ckpt").symlink_to(tmp_path / "store")
    error, _ = nodecheck.probe_dir(str(tmp_path / "ckpt"), "t", "n0", "{}")
    assert error is None and (tmp_path / "store" / nodecheck.TOKENS / "t" / "n0").is_file()
    assert nodecheck.tokens_seen(str(tmp_path / "ckpt"), "t", ["n0"], 0) == {"n0"}
