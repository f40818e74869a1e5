"""The compiled templates kept in the controller's cache (plan/render.py CompiledTemplates): a second run renders
without compiling, a changed template or syntax is compiled again, and a cache that cannot be used is no cache."""

from __future__ import annotations

import jinja2
import pytest

from sparkctl.plan import compiled_templates as cache_module
from sparkctl.plan import render as render_module


def env_over(templates, **syntax) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, **syntax)
    env.bytecode_cache = cache_module.compiled_templates(env)
    return env


def one_template(tmp_path, text: str):
    """A templates folder holding `a.j2` with `text`."""
    templates = tmp_path / "t"
    templates.mkdir()
    (templates / "a.j2").write_text(text)
    return templates


@pytest.fixture
def compiles(monkeypatch):
    """The names of the templates Jinja compiled (from their text)."""
    names: list[str] = []
    compile_source = jinja2.Environment.compile

    def counting(self, source, name=None, filename=None, raw=False, defer_init=False):
        names.append(name)
        return compile_source(self, source, name, filename, raw, defer_init)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    return names


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "sparkctl"


def test_a_second_environment_renders_from_the_cache_without_compiling(tmp_path, cache_home, compiles):
    templates = one_template(tmp_path, "{% for x in xs %}{{ x }}\n{% endfor %}")
    assert env_over(templates).get_template("a.j2").render(xs=[1, 2]) == "1\n2\n"
    assert compiles == ["a.j2"]
    assert env_over(templates).get_template("a.j2").render(xs=[3]) == "3\n"
    assert compiles == ["a.j2"]
    (directory,) = cache_home.iterdir()
    assert directory.name.startswith("templates-") and oct(directory.stat().st_mode & 0o777) == "0o700"


def test_a_changed_template_is_compiled_again(tmp_path, cache_home, compiles):
    templates = one_template(tmp_path, "one {{ x }}")
    assert env_over(templates).get_template("a.j2").render(x=1) == "one 1"
    (templates / "a.j2").write_text("two {{ x }}")
    assert env_over(templates).get_template("a.j2").render(x=1) == "two 1"
    assert compiles == ["a.j2", "a.j2"]


def test_other_syntax_settings_keep_their_own_compiled_code(tmp_path, cache_home, compiles):
    """trim_blocks changes the code a template compiles to, not its text: the cache is kept apart per setting."""
    templates = one_template(tmp_path, "{% if 1 %}\nx\n{% endif %}\n")
    assert env_over(templates).get_template("a.j2").render() == "\nx\n\n"
    assert env_over(templates, trim_blocks=True).get_template("a.j2").render() == "x\n"
    assert len(list(cache_home.iterdir())) == 2


@pytest.mark.parametrize("damage", [b"\x80\x05garbage", b"", b"\x80"], ids=["checksum", "cut", "cut checksum"])
def test_a_damaged_entry_is_compiled_again_and_replaced(tmp_path, cache_home, compiles, damage):
    """Jinja's own header intact, what follows it damaged (its checksum is a pickle: unpickling garbage raises)."""
    templates = one_template(tmp_path, "a {{ x }}")
    env_over(templates).get_template("a.j2")
    (entry,) = [p for d in cache_home.iterdir() for p in d.iterdir()]
    entry.write_bytes(jinja2.bccache.bc_magic + damage)
    assert env_over(templates).get_template("a.j2").render(x=2) == "a 2"
    assert compiles == ["a.j2", "a.j2"]
    assert env_over(templates).get_template("a.j2").render(x=3) == "a 3"
    assert compiles == ["a.j2", "a.j2"]


def test_a_cache_dir_that_cannot_be_made_is_no_cache(tmp_path, monkeypatch, compiles):
    """$XDG_CACHE_HOME under a file (as unusable for root as for anyone): rendered, compiled each time."""
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file" / "cache"))
    templates = one_template(tmp_path, "a {{ x }}")
    assert env_over(templates).bytecode_cache is None
    assert env_over(templates).get_template("a.j2").render(x=1) == "a 1"
    assert env_over(templates).get_template("a.j2").render(x=1) == "a 1"
    assert compiles == ["a.j2", "a.j2"]


def test_a_cache_dir_whose_entries_cannot_be_written_is_no_cache(tmp_path, cache_home, compiles, monkeypatch):
    """The directory made, but an entry cannot be written there (a full disk, a read-only mount): rendered all the
    same."""
    templates = one_template(tmp_path, "a {{ x }}")

    def refused(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jinja2.bccache.tempfile, "NamedTemporaryFile", refused)
    assert env_over(templates).get_template("a.j2").render(x=1) == "a 1"
    assert compiles == ["a.j2"]


def test_the_shipped_environment_keeps_its_compiled_templates_in_the_cache_dir(cache_home):
    render_module.template_env.cache_clear()
    try:
        env = render_module.template_env()
        assert isinstance(env.bytecode_cache, cache_module.CompiledTemplates)
        assert env.bytecode_cache.directory.startswith(str(cache_home))
    finally:
        render_module.template_env.cache_clear()


@pytest.mark.parametrize("which", ["sparkctl", "templates"])
def test_a_cache_dir_others_may_write_is_no_cache(tmp_path, cache_home, compiles, which):
    """What is loaded from the cache runs as code: a folder that a group or others may write is not used."""
    templates = one_template(tmp_path, "a {{ x }}")
    env_over(templates).get_template("a.j2")
    (directory,) = cache_home.iterdir()
    (cache_home if which == "sparkctl" else directory).chmod(0o777)
    assert env_over(templates).bytecode_cache is None
    assert env_over(templates).get_template("a.j2").render(x=1) == "a 1"
    assert compiles == ["a.j2", "a.j2"]


def test_a_cache_dir_that_is_a_link_is_no_cache(tmp_path, cache_home, compiles):
    templates = one_template(tmp_path, "a {{ x }}")
    env_over(templates).get_template("a.j2")
    (directory,) = cache_home.iterdir()
    elsewhere = tmp_path / "elsewhere"
    directory.rename(elsewhere)
    directory.symlink_to(elsewhere)
    assert env_over(templates).bytecode_cache is None
