import dataclasses
import sys
import textwrap
from pathlib import Path

import pytest

from attnbench import plugins, registry, testing
from attnbench.case import Case, CaseError
from attnbench.errors import UsageError

MISSION = {"naive", "sdpa", "xformers", "tiled"}


def cpu_case(**kw):
    base = dict(batch=1, heads=2, kv_heads=2, seq_q=8, seq_kv=8, head_dim=16, device="cpu")
    return Case(**{**base, **kw})


def write(path, text):
    path.write_text(textwrap.dedent(text))
    return path


def test_builtin_impls_are_discovered_from_the_impls_folder(impls):
    assert MISSION <= set(impls)
    assert impls["naive"].source == "attnbench.impls.naive"


def test_xformers_is_listed_on_cpu_as_unsupported_with_a_reason(impls):
    reasons = impls["xformers"].reasons(cpu_case())
    if not impls["xformers"].available:  # not installed (the GPU image): the install command;
        # its extension not loading in a CPU build of torch: CUDA only, first (no reinstall
        # would help)
        assert reasons == [impls["xformers"].unavailable]
        assert "pip install" in reasons[0] or reasons[0].startswith("CUDA only: ")
        return
    assert reasons and "device=cpu (supported: cuda)" in reasons[0]


def test_reasons_are_readable_and_complete():
    impl = registry.Impl(
        name="limited",
        fn=None,
        devices=("cuda",),
        dtypes=("float16",),
        head_dims=(64, 128),
        causal=False,
        cross=False,
        gqa=False,
        backward=False,
    )
    case = cpu_case(kv_heads=1, seq_kv=9, head_dim=16, causal=True, mode="bwd")
    assert impl.reasons(case) == [
        "device=cpu (supported: cuda)",
        "dtype=float32 (supported: float16)",
        "head_dim=16 (supported: 64, 128)",
        "causal=True (supported: False)",
        "seq_q=8 != seq_kv=9 (supported: equal lengths)",
        "kv_heads=1 < heads=2 (supported: kv_heads == heads)",
        "mode=bwd (supported: fwd; no backward)",
    ]
    assert registry.Impl(name="any", fn=None).reasons(case) == []


def test_plugin_file_registers_its_impl(tmp_path, monkeypatch):
    # leave no impl behind: the README's plugin, loaded by another test, has the same name
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))
    path = write(
        tmp_path / "my_attn.py",
        """
        from attnbench.registry import register

        @register("my_attn", devices=("cpu",), backward=False)
        def my_attn(q, k, v, *, causal, scale):
            return q
    """,
    )
    impls = plugins.discover([str(path)], builtin=False, entry_points=False)
    assert impls["my_attn"].available
    assert impls["my_attn"].source == str(path.resolve())
    assert impls["my_attn"].backward is False


def test_plugin_module_by_name(tmp_path, monkeypatch):
    write(
        tmp_path / "attn_mod_plugin.py",
        """
        from attnbench.registry import register

        @register("mod_attn")
        def mod_attn(q, k, v, *, causal, scale):
            return q
    """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    impls = plugins.discover(["attn_mod_plugin"], builtin=False, entry_points=False)
    assert impls["mod_attn"].source == "module attn_mod_plugin"


def test_entry_point_plugins_are_discovered(tmp_path, monkeypatch):
    write(
        tmp_path / "ep_attn_pkg.py",
        """
        from attnbench.registry import register

        @register("ep_attn")
        def ep_attn(q, k, v, *, causal, scale):
            return q
    """,
    )
    dist = tmp_path / "ep_attn_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-attn-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[attnbench.impls]\nep_attn = ep_attn_pkg\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    impls = plugins.discover(builtin=False)
    assert impls["ep_attn"].available
    assert impls["ep_attn"].source.startswith("entry point ep_attn")


def test_a_named_plugin_that_fails_to_import_is_bad_input_naming_file_and_error(tmp_path):
    path = write(tmp_path / "broken_named.py", "def broken(:\n")
    with pytest.raises(plugins.PluginImportError) as exc:
        plugins.discover([str(path)], builtin=False, entry_points=False)
    message = str(exc.value)
    assert str(path.resolve()) in message and "SyntaxError" in message and "\n" not in message
    with pytest.raises(plugins.PluginImportError):  # asked for again: refused again
        plugins.discover([str(path)], builtin=False, entry_points=False)


def test_a_dropped_in_plugin_that_fails_to_import_is_unavailable_with_file_and_error(
    tmp_path, monkeypatch
):
    (tmp_path / "impls").mkdir()  # a checkout whose drop-in impls/ holds a broken file
    monkeypatch.setattr(plugins.checkout, "root", lambda: tmp_path)
    path = write(tmp_path / "impls" / "broken_attn.py", "import not_a_real_module_xyz\n")
    impls = plugins.discover(entry_points=False)
    impl = impls["broken_attn"]
    assert not impl.available
    assert str(path.resolve()) in impl.unavailable
    assert "ModuleNotFoundError" in impl.unavailable and "not_a_real_module_xyz" in impl.unavailable
    assert impl.reasons(cpu_case()) == [impl.unavailable]


def test_missing_optional_dependency_gives_the_install_command(tmp_path):
    path = write(
        tmp_path / "needs_dep.py",
        """
        from attnbench.registry import register

        @register("needs_dep", requires={"fancy_attn_lib_xyz": "pip install fancy-attn-lib"})
        def needs_dep(q, k, v, *, causal, scale):
            import fancy_attn_lib_xyz
    """,
    )
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)["needs_dep"]
    assert impl.unavailable == (
        "needs fancy_attn_lib_xyz, which is not installed (install: pip install fancy-attn-lib)"
    )


def test_a_plugin_cannot_take_a_builtin_name(tmp_path, impls):
    path = write(
        tmp_path / "imposter.py",
        """
        from attnbench.registry import register

        @register("naive")
        def naive(q, k, v, *, causal, scale):
            return q
    """,
    )
    with pytest.raises(registry.NameClash) as exc:
        plugins.discover([str(path)], builtin=False, entry_points=False)
    message = str(exc.value)
    assert "attnbench.impls.naive" in message and str(path) in message and "\n" not in message
    assert plugins.discover(builtin=False, entry_points=False)["naive"].source == (
        "attnbench.impls.naive"
    )


def test_missing_plugin_path_is_bad_input(tmp_path):
    """A --plugin value that names nothing is a usage error, not an error of a case."""
    (tmp_path / "empty").mkdir()
    given = [
        str(tmp_path / "nope.py"),
        "no_such_module_xyz",
        "not a module",
        str(tmp_path / "empty"),
    ]
    said = ("no such file", "no such file or importable module", "neither", "no .py file")
    for spec, words in zip(given, said):
        with pytest.raises(UsageError, match=words) as exc:
            plugins.plugin_source(spec)
        assert not isinstance(exc.value, CaseError), exc.value


def test_bad_capability_is_refused():
    with pytest.raises(registry.RegistryError, match="dtypes"):
        registry.register("bad_dtype", dtypes=("float64",))(lambda q, k, v, **kw: q)
    assert "bad_dtype" not in plugins.discover(builtin=False, entry_points=False)
    sys.modules.pop("bad_dtype", None)


def test_masks_are_opt_in_with_readable_reasons(impls):
    case = cpu_case(mask="window", pattern="4")
    plain = registry.Impl(name="plain", fn=None)
    assert plain.reasons(case) == ["mask=window (supported: none)"]
    assert not plain.takes_mask
    some = registry.Impl(name="some", fn=None, masks=("none", "padding"))
    assert some.reasons(case) == ["mask=window (supported: none, padding)"]
    assert some.takes_mask and some.reasons(cpu_case(mask="padding")) == []
    assert impls["triton_flash"].masks == ("none",)  # no mask beyond causal
    assert impls["xformers"].masks == ("none", "document")  # packed documents only
    for name, supported in (("triton_flash", "none"), ("xformers", "none, document")):
        if not impls[name].available:  # not installed: its capabilities are still data
            continue
        reasons = impls[name].reasons(cpu_case(mask="padding"))
        assert f"mask=padding (supported: {supported})" in reasons


def test_register_adds_none_to_the_masks_and_refuses_unknown_ones(monkeypatch):
    monkeypatch.setattr(registry, "_IMPLS", dict(registry._IMPLS))  # leave no impl behind
    registry.register("masked_attn", masks=("window",))(lambda q, k, v, **kw: q)
    impls = plugins.discover(builtin=False, entry_points=False)
    assert impls["masked_attn"].masks == ("none", "window")
    with pytest.raises(registry.RegistryError, match="masks"):
        registry.register("bad_mask", masks=("diagonal",))(lambda q, k, v, **kw: q)


def test_an_impl_without_masks_is_never_called_with_mask(tmp_path):
    from attnbench.run.measuring.call import Call
    from attnbench.run.measuring.inputs import make_inputs

    path = write(
        tmp_path / "strict_attn.py",
        """
        import torch.nn.functional as F
        from attnbench.registry import register

        @register("strict_attn")
        def strict_attn(q, k, v, *, causal, scale):  # no **kwargs: mask= would raise
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    """,
    )
    impl = plugins.discover([str(path)], builtin=False, entry_points=False)["strict_attn"]
    case = cpu_case(causal=True)
    out, _ = Call.prepare(impl, case, make_inputs(case, 0)).check()
    assert out.shape == (1, 2, 8, 16)


def test_a_working_folders_impls_is_loaded_only_when_asked(tmp_path):
    """An unrelated project's impls/ is never imported behind the user's back (a wheel run
    from any folder); --plugin FOLDER loads it, and says so."""
    from attnbench.cli import list_impls

    (tmp_path / "impls").mkdir()  # the tests run in tmp_path (conftest): the working folder
    marker = tmp_path / "imported"
    dropped = write(
        tmp_path / "impls" / "theirs.py",
        f"""
        from pathlib import Path
        from attnbench import register

        Path({str(marker)!r}).write_text("imported")

        @register("theirs_dropped")
        def theirs_dropped(q, k, v, *, causal, scale):
            return q
    """,
    )
    assert "theirs_dropped" not in plugins.discover(entry_points=False)
    assert not marker.exists()
    impls = plugins.discover(["impls"], entry_points=False)
    assert impls["theirs_dropped"].source == str(dropped.resolve()) and marker.exists()
    assert plugins.impl_origin(impls["theirs_dropped"]) == "--plugin"
    assert plugins.impl_origin(impls["naive"]) == "built-in"
    registry.register("registered_in_process")(lambda q, k, v, *, causal, scale: q)
    impls = plugins.discover(["impls"], entry_points=False)
    assert plugins.impl_origin(impls["registered_in_process"]) == "register()"
    listing = list_impls(impls, "cpu")
    assert str(dropped.resolve()) in listing
    assert max(len(line) for line in listing.splitlines()) <= 100
    row = next(line for line in listing.splitlines() if line.startswith("theirs_dropped "))
    assert row.endswith("--plugin")


def test_the_checkouts_impls_folder_is_loaded_in_a_checkout_only(tmp_path, monkeypatch):
    from attnbench import checkout

    folder = tmp_path / "co" / "impls"
    folder.mkdir(parents=True)
    write(
        folder / "mine.py",
        """
        from attnbench import register

        @register("co_dropped")
        def co_dropped(q, k, v, *, causal, scale):
            return q
    """,
    )
    monkeypatch.setattr(checkout, "root", lambda: None)  # an installed package
    assert "co_dropped" not in plugins.discover(entry_points=False)
    monkeypatch.setattr(checkout, "root", lambda: tmp_path / "co")  # a checkout
    impls = plugins.discover(entry_points=False)
    assert plugins.impl_origin(impls["co_dropped"]) == "impls/"
    assert checkout.version() != "unknown"


def test_install_hints_name_packages_an_index_has(impls):
    """Each hint installs the requirement of a pyproject extra by its own name: it works from a
    wheel as from a checkout (attnbench itself is on no index)."""
    import shlex

    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    from attnbench.run.executing.ray_cluster import INSTALL_HINT

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    extras = {r for reqs in pyproject["project"]["optional-dependencies"].values() for r in reqs}
    hints = [cmd for impl in impls.values() for cmd in impl.requires.values()] + [INSTALL_HINT]
    assert len(hints) >= 4  # triton_flash, triton_flash_fa2, xformers, ray
    for cmd in hints:
        args = shlex.split(cmd)
        assert args[:2] == ["pip", "install"] and "attnbench" not in cmd, cmd
        packages = {a for a in args[2:] if not a.startswith("--")}  # pip's own options aside
        # FlashAttention-3 is on no index: its hint builds it from the project's repository
        built = {a for a in packages if a.startswith("git+https://")}
        assert packages - built <= extras, (cmd, sorted(extras))


def test_an_impl_that_needs_a_mask_does_not_declare_none(impls):
    case = Case(batch=1, heads=2, kv_heads=2, seq_q=64, seq_kv=64, head_dim=32)
    for name in ("sdpa_nested", "sdpa_padded"):
        assert impls[name].masks == ("document",)
        assert impls[name].reasons(case) == ["mask=none (supported: document)"]
    with pytest.raises(registry.RegistryError, match="unmasked=False needs"):
        registry.register("needs_a_mask", unmasked=False)(lambda q, k, v, *, causal, scale: q)


def test_register_mirrors_the_impl_fields():
    """What a plugin author reads is what an impl has: Impl's fields are the three
    declarations' fields and register's own keywords, with the same defaults, but fn (the
    decorated function) and source (where it was loaded from)."""
    import inspect

    from attnbench.declarations import DECLARATIONS

    params = inspect.signature(registry.register).parameters
    declared = {f.name: f for kind in DECLARATIONS for f in dataclasses.fields(kind)}
    own = set(params) - {"name", "keywords", *(k.__name__.lower() for k in DECLARATIONS)}
    fields = {f.name: f for f in dataclasses.fields(registry.Impl)}
    assert set(fields) - {"fn", "source"} == set(declared) | own | {"name"}
    assert not set(declared) & own, "a field is declared twice"
    for name in own:
        assert params[name].default == fields[name].default, name
    for kind in DECLARATIONS:
        assert params[kind.__name__.lower()].default == kind()


def test_register_takes_the_declarations_and_the_old_keywords_alike():
    """The flat keywords of plugins written before the declarations make the same impl as
    the declarations; a keyword amends the declaration given; a wrong one is named with the
    closest field."""
    from attnbench import Runs, Supports, Takes

    def attend(q, k, v, *, causal, scale):
        return q

    with testing.registered():
        registry.register("flat", dtypes=("float32",), gqa=False, layout="bshd", devices=("cpu",))(
            attend
        )
        registry.register(
            "grouped",
            takes=Takes(layout="bshd"),
            supports=Supports(dtypes=("float32",), gqa=False),
            runs=Runs(devices=("cpu",)),
        )(attend)
        registry.register("mixed", supports=Supports(dtypes=("float32",)), gqa=False,
                          layout="bshd", devices=("cpu",))(attend)  # fmt: skip
        impls = registry.impls()
        same = [dataclasses.replace(impls[n], name="x") for n in ("flat", "grouped", "mixed")]
        assert same[0] == same[1] == same[2]
        assert same[0].gqa is False and same[0].layout == "bshd" and same[0].dtypes == ("float32",)
        with pytest.raises(registry.RegistryError, match="no argument 'gqaa'.*gqa"):
            registry.register("typo", gqaa=False)(attend)
        with pytest.raises(registry.RegistryError, match=r"supports= takes Supports\(...\)"):
            registry.register("wrong", supports=Takes())(attend)
