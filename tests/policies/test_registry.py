"""Issue #12 fault 3: one broken ``kvtier.policies`` plugin must not break the others, the
API or the CLI. The plugins here are real installed distributions: a ``*.dist-info`` folder
with an ``entry_points.txt`` on ``sys.path``, found by ``importlib.metadata``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from kvtier import OffloadingManager, PolicyError
from kvtier.policies import PolicyPluginError, PolicyPluginWarning, registry
from kvtier.policies.lru import LRUPolicy

SRC = str(Path(__file__).resolve().parents[2] / "src")


def install_plugins(root: Path) -> Path:
    """Two distributions: ``brokenplug`` (its entry point names a missing module) and
    ``goodplug`` (a working policy). Sorted so that the broken one is listed first."""
    (root / "goodplug_mod.py").write_text(textwrap.dedent("""
        from kvtier.policies.lru import LRUPolicy

        class GoodPolicy(LRUPolicy):
            name = "good-lru"
    """))
    for dist, entry in (("aaa_brokenplug", "broken-pol = no_such_module_kvtier_xyz:Policy"),
                        ("goodplug", "good-lru = goodplug_mod:GoodPolicy")):
        info = root / f"{dist}-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text(f"[kvtier.policies]\n{entry}\n")
    return root


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    root = install_plugins(tmp_path)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_BROKEN", {})
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    return root


def test_a_broken_plugin_is_skipped_with_a_warning_and_the_others_load(plugins):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        names = registry.available_policies()
    assert "good-lru" in names and "lru" in names and "broken-pol" not in names
    messages = [str(w.message) for w in caught if issubclass(w.category, PolicyPluginWarning)]
    assert len(messages) == 1
    assert "'broken-pol'" in messages[0] and "no_such_module_kvtier_xyz" in messages[0]
    assert "ModuleNotFoundError" in messages[0] and "aaa_brokenplug" in messages[0]
    # the second call gives the same list, without warning again
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert registry.available_policies() == names
    assert not again
    assert registry.get_policy("good-lru").__name__ == "GoodPolicy"
    assert isinstance(OffloadingManager(4, "good-lru").policy, LRUPolicy)


def test_asking_for_the_broken_plugin_by_name_gives_its_error(plugins):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(PolicyPluginError, match="'broken-pol'.*ModuleNotFoundError") as info:
            registry.get_policy("broken-pol")
        assert isinstance(info.value.error, ModuleNotFoundError)
        with pytest.raises(PolicyPluginError, match="no_such_module_kvtier_xyz"):
            OffloadingManager(4, "broken-pol")
        with pytest.raises(ValueError, match="unknown policy 'nope'"):
            registry.get_policy("nope")


def test_a_plugin_object_that_is_not_a_policy_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "notapolicy_mod.py").write_text("Thing = dict\n")
    info = tmp_path / "notapol-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: notapol\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[kvtier.policies]\nthing = notapolicy_mod:Thing\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_BROKEN", {})
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    with pytest.warns(PolicyPluginWarning, match="'thing'.*not a CachePolicy subclass"):
        assert "thing" not in registry.available_policies()


def test_cli_help_and_replay_survive_a_broken_plugin(tmp_path):
    root = install_plugins(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, str(root)])}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "kvtier.cli", *args], env=env,
                              capture_output=True, text=True, timeout=120)

    res = cli("--help")
    assert res.returncode == 0 and "replay" in res.stdout
    assert "broken-pol" in res.stderr and "ModuleNotFoundError" in res.stderr
    res = cli("replay", "-p", "lru,good-lru", "-c", "500", "--json", "-")
    assert res.returncode == 0, res.stderr
    assert '"policy": "good-lru"' in res.stdout
    res = cli("replay", "-p", "broken-pol", "-c", "500")
    assert res.returncode == 1
    assert "policy plugin 'broken-pol'" in res.stderr and "no_such_module_kvtier_xyz" in res.stderr


@pytest.mark.parametrize("name", ["a,b", " lru2", "lru2 ", "\tx", "my policy", "a\nb"])
def test_a_name_the_cli_cannot_select_is_refused(name):
    # newcomer finding: register_policy("a,b", ...) was accepted and listed among the CLI's
    # choices, but `kvtier replay -p a,b` splits it into 'a' and 'b' (and strips spaces), so
    # the policy could never be chosen there
    # (a newcomer pass found inner spaces and newlines accepted too)
    before = registry.available_policies()
    with pytest.raises(ValueError, match=re.escape(f"policy name {name!r}") + ".* comma and "
                                         "no whitespace"):
        registry.register_policy(name, LRUPolicy)
    assert registry.available_policies() == before


def test_a_class_under_two_names_is_reported_by_the_name_it_was_built_from(monkeypatch):
    """Found by a newcomer pass: a manager built from a second name of a class reported the
    class's ``name`` (another policy's name) in its errors."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))

    class Bad(LRUPolicy):
        name = "bad-first"

        def _evict(self, n, protected):
            return []

    registry.register_policy("bad-first", Bad)
    registry.register_policy("bad-second", Bad)
    m = OffloadingManager(1, "bad-second")
    m.complete_store(m.prepare_store(["a"]).keys_to_store)
    with pytest.raises(PolicyError, match=r"^policy 'bad-second': Bad\.evict\(1\)") as err:
        m.prepare_store(["b"])
    assert err.value.policy == "bad-second"
    assert OffloadingManager(1, Bad)._policy_name == "bad-first"  # a class: its own name


def test_plugin_error_survives_pickling():
    """As kvtier.errors' errors (tests/test_errors.py): a sweep worker sends its error to the
    parent pickled; the four-field constructor made unpickling fail (newcomer finding)."""
    import pickle

    from kvtier.policies.registry import PolicyPluginError

    err = PolicyPluginError("mine", "pkg.mod:Cls", "pkg", ImportError("no module pkg.mod"))
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == str(err) and (back.name, back.target, back.dist) == ("mine",
                                                                          "pkg.mod:Cls", "pkg")


def test_a_policy_class_that_cannot_be_built_is_refused_at_registration():
    """Found by a newcomer session: register_policy took a CachePolicy subclass that left
    abstract hooks (here all of them), listed it among the CLI's choices, and only building
    a manager with it failed ("Can't instantiate abstract class"): in a sweep, in every
    worker. A plugin that does so is now skipped at load with the other broken plugins."""
    from kvtier import CachePolicy

    class Unfinished(CachePolicy):
        def clear(self):
            pass

    before = registry.available_policies()
    with pytest.raises(TypeError, match=r"policy 'unfinished': Unfinished is abstract "
                                        r"\(not implemented: _evict, mark_evictable"):
        registry.register_policy("unfinished", Unfinished)
    assert registry.available_policies() == before


@pytest.mark.parametrize("name", [["lru"], None, 5])
def test_get_policy_names_a_name_that_is_not_a_str(name):
    """Found by a newcomer session: get_policy(["lru"]) raised a bare "unhashable type:
    'list'"."""
    with pytest.raises(ValueError, match=re.escape(f"unknown policy {name!r}") + ".*known"):
        registry.get_policy(name)


@pytest.mark.parametrize("name", ["a\x1b[31mb", "a\x00b", "a\u200bb", "lru\x7f"])
def test_a_name_with_an_unprintable_character_is_refused(name):
    """Control and invisible characters (an escape sequence, NUL, a zero-width space) pass
    the whitespace rule but print as nothing or as terminal codes in the CLI's tables and
    --help, and cannot be typed after -p."""
    before = registry.available_policies()
    with pytest.raises(ValueError, match=re.escape(f"policy name {name!r}") + ".*printable"):
        registry.register_policy(name, LRUPolicy)
    assert registry.available_policies() == before
