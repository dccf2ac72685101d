def test_a_toolchain_link_through_an_outside_dir_is_taken_where_it_leads(tmp_path):
    """A system header that is a link through /etc/alternatives back into the toolchain's
    dirs is the system's, found wherever the walk to it went; the same link in a tenant's
    root is walked strictly (whether the outside dir is there would be told)."""
    from safejit.closure.anchors import Walk

    include = tmp_path / "tc" / "include"
    (include / "real").mkdir(parents=True)
    (include / "real" / "h.h").write_text("x")
    (tmp_path / "etc" / "alt").mkdir(parents=True)
    (tmp_path / "etc" / "alt" / "h.h").symlink_to(include / "real" / "h.h")
    (include / "h.h").symlink_to(tmp_path / "etc" / "alt" / "h.h")
    assert not Walk([str(include)], system=[str(include)]).leads_out(str(include / "h.h"))
    assert Walk([str(include)]).leads_out(str(include / "h.h"))
    # (a '..' after such a link is still the walk's: it climbs from where the link led)
    assert Walk([str(include)], system=[str(include)]).leads_out(str(include / "h.h" / ".." / ".." / ".." / "x"))
