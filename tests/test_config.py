"""Tests for reference_trainers.config.schema: validation errors, YAML loading, ``--set`` overrides, defaults."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from reference_trainers.config.schema import (OptimizationsConfig, TrainConfig, _accepted_scalars, build_config,
                                              to_plain_dict)
from reference_trainers.config.files import apply_overrides, deep_merge, parse_override, read_yaml
from reference_trainers.config.errors import ConfigError


def config_error(overrides: list[str], data: dict | None = None) -> str:
    """The message of the ConfigError that ``build_config`` raises; fails the test if none is raised."""
    with pytest.raises(ConfigError) as info:
        build_config(data or {}, overrides)
    return str(info.value)


def assert_one_line(message: str, *fragments: str) -> None:
    assert message, "empty error message"
    assert "\n" not in message and "\r" not in message, f"not one line: {message!r}"
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from {message!r}"


# --------------------------------------------------------------------------- unknown keys


def test_unknown_nested_key_suggests_close_match_and_lists_accepted_keys() -> None:
    message = config_error(["optimizations.ampp=true"])
    assert_one_line(message, "optimizations.ampp", "unknown key", "did you mean 'amp'?")
    # What is accepted: every real field of the section.
    for name in OptimizationsConfig.model_fields:
        assert name in message
    assert message.startswith("optimizations.ampp:")


def test_unknown_top_level_key_suggests_close_match() -> None:
    message = config_error(["envv.id=CartPole-v1"])
    assert_one_line(message, "envv", "unknown key", "did you mean 'env'?")
    for name in TrainConfig.model_fields:
        assert name in message


def test_unknown_key_in_yaml_data_names_its_dotted_path() -> None:
    message = config_error([], {"ppo": {"gama": 0.9}})
    assert_one_line(message, "ppo.gama", "did you mean 'gamma'?")


def test_unknown_key_without_close_match_gives_no_guess() -> None:
    message = config_error(["optimizations.zzzzqqq=1"])
    assert_one_line(message, "optimizations.zzzzqqq", "unknown key", "accepted:")
    assert "did you mean" not in message


# --------------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("override", "key", "value", "accepted"),
    [
        ("env.num_envs=abc", "env.num_envs", "'abc'", "integer"),
        ("env.num_envs=1.5", "env.num_envs", "1.5", "integer"),
        ("env.num_envs=0", "env.num_envs", "0", "greater than or equal to 1"),
        ("env.num_envs=5000", "env.num_envs", "5000", "less than or equal to 4096"),
        ("ppo.gamma=1.5", "ppo.gamma", "1.5", "less than or equal to 1"),
        ("ppo.learning_rate=0", "ppo.learning_rate", "0", "greater than 0"),
        ("seed=-1", "seed", "-1", "greater than or equal to 0"),
        ("optimizations.inference_batch_size=0", "optimizations.inference_batch_size", "0", "greater than or equal to 1"),
        ("model.hidden_sizes=[0]", "model.hidden_sizes", "[0]", "[1, 65536]"),
        ("model.hidden_sizes=[]", "model.hidden_sizes", "[]", "at least 1"),
        ("env=3", "env", "3", "dictionary"),
    ],
)
def test_wrong_type_or_out_of_range_names_key_value_and_accepted(override: str, key: str, value: str, accepted: str) -> None:
    message = config_error([override])
    assert_one_line(message, f"{key}: invalid value {value}", accepted)
    assert message.startswith(f"{key}:")


@pytest.mark.parametrize(
    ("override", "key", "accepted"),
    [
        ("optimizations.optimizer_impl=fast", "optimizations.optimizer_impl", ["'forloop'", "'foreach'", "'fused'", "'auto'"]),
        ("optimizations.amp_dtype=fp16", "optimizations.amp_dtype", ["'bfloat16'", "'float16'", "'auto'"]),
        ("optimizations.matmul_precision=low", "optimizations.matmul_precision", ["'highest'", "'high'", "'medium'", "'auto'"]),
        ("env.vectorization=fast", "env.vectorization", ["'serial'", "'sync'", "'async'", "'native'", "'auto'"]),
        ("stability.nan_policy=ignore", "stability.nan_policy", ["'raise'", "'skip_update'", "'warn'"]),
        ("model.activation=gelu", "model.activation", ["'tanh'", "'relu'"]),
    ],
)
def test_value_outside_literal_set_lists_every_accepted_value(override: str, key: str, accepted: list[str]) -> None:
    bad = override.partition("=")[2]
    message = config_error([override])
    assert_one_line(message, f"{key}: invalid value '{bad}'", *accepted)


@pytest.mark.parametrize("raw", [".nan", ".inf", "-.inf"])
@pytest.mark.parametrize("key", ["ppo.learning_rate", "ppo.clip_coef", "stability.max_grad_norm"])
def test_nan_and_inf_are_rejected_as_not_finite(key: str, raw: str) -> None:
    message = config_error([f"{key}={raw}"])
    assert_one_line(message, f"{key}: invalid value", "finite")


@pytest.mark.parametrize("flag", ["amp", "tf32", "compile_model", "compile_train_step", "cuda_graphs", "pinned_memory", "non_blocking"])
@pytest.mark.parametrize("raw", ["maybe", "2", "null"])
def test_bool_or_auto_flag_error_mentions_true_false_and_auto_once(flag: str, raw: str) -> None:
    message = config_error([f"optimizations.{flag}={raw}"])
    assert_one_line(message, f"optimizations.{flag}: invalid value", "true", "false", "'auto'")
    # The two union branches are one problem, not two.
    assert "more problem" not in message


def test_bool_flag_rejects_non_boolean_word() -> None:
    message = config_error(["optimizations.batch_inference=maybe"])
    assert_one_line(message, "optimizations.batch_inference: invalid value 'maybe'", "boolean")


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "mps:0", "cpu:1", "cuda:-1", "CUDA"])
def test_bad_device_string_lists_accepted_devices(device: str) -> None:
    message = config_error([f"device={device}"])
    assert_one_line(message, f"device: invalid value '{device}'", "auto", "cpu", "cuda:N", "mps")


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps"])
def test_valid_device_strings_are_accepted_without_probing_hardware(device: str) -> None:
    assert build_config({}, [f"device={device}"]).device == device



def test_device_with_empty_index_is_rejected() -> None:
    message = config_error([], {"device": "cuda:"})  # as written in YAML: device: "cuda:"
    assert_one_line(message, "device: invalid value 'cuda:'", "cuda:N")



def test_torch_threads_error_names_plain_key_and_accepted_values() -> None:
    message = config_error(["optimizations.torch_threads=0"])
    assert_one_line(message, "optimizations.torch_threads: invalid value 0", "'auto'")
    assert "constrained-int" not in message
    assert "more problem" not in message



def test_boolean_for_integer_count_is_rejected() -> None:
    message = config_error(["env.num_envs=true"])
    assert_one_line(message, "env.num_envs: invalid value True")


def test_several_problems_are_one_line_with_a_count() -> None:
    message = config_error(["ppo.gamma=2", "env.num_envs=0", "optimizations.ampp=1"])
    assert_one_line(message, "(and 2 more problems)")


def test_setting_a_key_under_a_scalar_from_defaults_is_a_type_error_on_that_key() -> None:
    message = config_error(["env.id.x=1"])
    assert_one_line(message, "env.id", "{'x': 1}", "string")


def test_setting_a_key_under_a_scalar_in_data_names_the_override() -> None:
    with pytest.raises(ConfigError) as info:
        apply_overrides({"env": {"id": "CartPole-v1"}}, ["env.id.x=1"])
    assert_one_line(str(info.value), "env.id.x=1", "id is a value, not a section")


# --------------------------------------------------------------------------- --set syntax


@pytest.mark.parametrize("text", ["novalue", "a..b=1", "=1", ".a=1", "a.=1", " =1"])
def test_override_syntax_error_shows_the_text_and_the_expected_form(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_override(text)
    assert_one_line(str(info.value), "--set", repr(text), "KEY=VALUE")


def test_override_syntax_error_surfaces_through_build_config() -> None:
    message = config_error(["novalue"])
    assert_one_line(message, "'novalue'", "KEY=VALUE")


@pytest.mark.parametrize(
    ("text", "path", "value"),
    [
        ("optimizations.amp=true", ["optimizations", "amp"], True),
        ("optimizations.amp=false", ["optimizations", "amp"], False),
        ("optimizations.amp=auto", ["optimizations", "amp"], "auto"),
        ("env.num_envs=16", ["env", "num_envs"], 16),
        ("ppo.learning_rate=0.001", ["ppo", "learning_rate"], 0.001),
        ("model.hidden_sizes=[32,32]", ["model", "hidden_sizes"], [32, 32]),
        ("optimizations.torch_threads=null", ["optimizations", "torch_threads"], None),
        ("optimizations.inference_batch_size=", ["optimizations", "inference_batch_size"], None),
        ("env.kwargs.note=a=b", ["env", "kwargs", "note"], "a=b"),
        (" seed = 7", ["seed"], 7),
    ],
)
def test_parse_override_reads_values_as_yaml_scalars(text: str, path: list[str], value: object) -> None:
    got_path, got_value = parse_override(text)
    assert got_path == path
    assert got_value == value and type(got_value) is type(value)


def test_apply_overrides_coerces_yaml_scalars_and_creates_sections() -> None:
    out = apply_overrides({}, ["optimizations.amp=true", "model.hidden_sizes=[32,32]", "ppo.num_steps=64"])
    assert out == {"optimizations": {"amp": True}, "model": {"hidden_sizes": [32, 32]}, "ppo": {"num_steps": 64}}
    assert out["optimizations"]["amp"] is True



def test_apply_overrides_reads_exponent_without_dot_as_float() -> None:
    out = apply_overrides({}, ["ppo.learning_rate=1e-3", "env.kwargs.scale=2e-1"])
    assert out["ppo"]["learning_rate"] == pytest.approx(1e-3) and isinstance(out["ppo"]["learning_rate"], float)
    # env.kwargs is passed to gymnasium.make as-is: no validator would coerce it later.
    assert isinstance(out["env"]["kwargs"]["scale"], float)


def test_build_config_turns_exponent_learning_rate_into_float() -> None:
    config = build_config({}, ["ppo.learning_rate=1e-3"])
    assert config.ppo.learning_rate == pytest.approx(1e-3)
    assert isinstance(config.ppo.learning_rate, float)


def test_later_override_wins() -> None:
    config = build_config({"env": {"num_envs": 4}}, ["env.num_envs=16", "env.num_envs=32"])
    assert config.env.num_envs == 32


def test_apply_overrides_does_not_mutate_top_level_of_input() -> None:
    data = {"seed": 3}
    apply_overrides(data, ["seed=5", "env.num_envs=2"])
    assert data == {"seed": 3}



def test_apply_overrides_does_not_mutate_nested_sections_of_input() -> None:
    data = {"env": {"num_envs": 4}, "optimizations": {"amp": False}}
    before = copy.deepcopy(data)
    out = apply_overrides(data, ["env.num_envs=16", "optimizations.amp=true"])
    assert out["env"]["num_envs"] == 16
    assert data == before


def test_deep_merge_merges_recursively_and_update_wins() -> None:
    base = {"env": {"id": "CartPole-v1", "num_envs": 4}, "seed": 1}
    update = {"env": {"num_envs": 8}, "run": {"steps": 10}}
    merged = deep_merge(base, update)
    assert merged == {"env": {"id": "CartPole-v1", "num_envs": 8}, "seed": 1, "run": {"steps": 10}}
    assert base == {"env": {"id": "CartPole-v1", "num_envs": 4}, "seed": 1}
    assert update == {"env": {"num_envs": 8}, "run": {"steps": 10}}


# --------------------------------------------------------------------------- YAML files


def test_read_yaml_missing_file_is_config_error_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert_one_line(str(info.value), "not found", str(path))


def test_read_yaml_directory_is_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read_yaml(tmp_path)
    assert_one_line(str(info.value), str(tmp_path))


@pytest.mark.parametrize(
    ("text", "line"),
    [("a: [1, 2\nb: 3\n", 2), ("a:\n\t- 1\n", 2), ("a: b: c\n", 1), ("x: 1\na: !!python/object:os.system x\n", 2)],
)
def test_read_yaml_malformed_names_file_and_line(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert_one_line(str(info.value), str(path), "malformed YAML", f"line {line}")


@pytest.mark.parametrize(("text", "kind"), [("- 1\n- 2\n", "list"), ("just a string\n", "str"), ("42\n", "int")])
def test_read_yaml_non_mapping_top_level_is_rejected(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "top.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert_one_line(str(info.value), str(path), "mapping", kind)


@pytest.mark.parametrize("text", ["", "\n  \n", "# nothing here\n", "---\n"])
def test_read_yaml_empty_file_is_an_error_naming_the_file(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert_one_line(str(info.value), str(path), "empty", "expected a YAML mapping")


def test_read_yaml_empty_section_still_means_its_defaults(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("optimizations:\nenv: {num_envs: 2}\n")
    config = build_config(read_yaml(path))
    assert config.optimizations == OptimizationsConfig() and config.env.num_envs == 2


@pytest.mark.parametrize(("text", "key", "lines"), [
    ("env:\n  id: CartPole-v1\n  num_envs: 2\n  id: Acrobot-v1\n", "'id'", "2 and 4"),
    ("seed: 1\nenv: {id: CartPole-v1}\nseed: 2\n", "'seed'", "1 and 3"),
    ("env: {num_envs: 2, num_envs: 4}\n", "'num_envs'", "1 and 1"),
    ("variants:\n  baseline: {}\n  baseline: {}\n", "'baseline'", "2 and 3"),
])
def test_read_yaml_duplicate_key_names_the_key_and_both_lines(tmp_path: Path, text: str, key: str, lines: str) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        read_yaml(path)
    assert_one_line(str(info.value), str(path), f"duplicate key {key} at lines {lines}")


def test_read_yaml_keeps_merge_keys_aliases_and_yaml12_floats(tmp_path: Path) -> None:
    """A key beside a merge overrides the merged one (YAML's rule, not a duplicate); the same key in
    two different mappings is no duplicate either."""
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {num_envs: 2, id: CartPole-v1}\nenv:\n  <<: *b\n  num_envs: 4\n"
                    "ppo: {learning_rate: 1e-3}\ndqn: {learning_rate: 2.5E-4}\n")
    data = read_yaml(path)
    assert data["env"] == {"num_envs": 4, "id": "CartPole-v1"}
    assert data["ppo"]["learning_rate"] == pytest.approx(1e-3) and isinstance(data["dqn"]["learning_rate"], float)


def test_a_yaml_file_is_read_then_overrides_applied(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("env: {id: Acrobot-v1, num_envs: 4}\noptimizations:\n  amp: auto\n  optimizer_impl: foreach\n")
    config = build_config(read_yaml(path), ["env.num_envs=6", "optimizations.tf32=auto"])
    assert config.env.id == "Acrobot-v1"
    assert config.env.num_envs == 6
    assert config.optimizations.amp == "auto"
    assert config.optimizations.tf32 == "auto"
    assert config.optimizations.optimizer_impl == "foreach"


def test_unknown_key_in_a_yaml_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("optimizations:\n  compile_modell: true\n")
    with pytest.raises(ConfigError) as info:
        build_config(read_yaml(path))
    assert_one_line(str(info.value), "optimizations.compile_modell", "did you mean 'compile_model'?")


# --------------------------------------------------------------------------- defaults


def test_defaults_are_the_plain_path() -> None:
    config = build_config({})
    o = config.optimizations
    assert o.batch_inference is False
    assert o.inference_batch_size is None
    assert o.amp is False
    assert o.matmul_precision == "highest"
    assert o.tf32 is False
    assert o.compile_model is False and o.compile_train_step is False
    assert o.compile_mode == "default"
    assert o.cuda_graphs is False
    assert o.pinned_memory is False and o.non_blocking is False
    assert o.optimizer_impl == "forloop"
    assert o.sync_free_logging is False
    assert o.torch_threads is None
    assert config.env.vectorization == "serial"
    assert config.env.action_repeat == 1


def test_every_optimisation_flag_defaults_to_its_plain_path() -> None:
    """Guards new flags too: none may default to on or to ``auto``."""
    plain = {False, None, "forloop", "highest", "default", "list"}
    for name, field in OptimizationsConfig.model_fields.items():
        default = field.get_default(call_default_factory=True)
        if name == "amp_dtype":  # only read when amp is on, and amp defaults to off
            continue
        assert default in plain and default is not True, f"optimizations.{name} defaults to {default!r}"


def test_plain_dict_round_trips_through_build_config() -> None:
    config = build_config({}, ["optimizations.amp=auto", "model.hidden_sizes=[32,16]", "env.kwargs.max_episode_steps=50"])
    data = to_plain_dict(config)
    assert data["optimizations"]["amp"] == "auto"
    assert data["model"]["hidden_sizes"] == [32, 16]
    assert build_config(data) == config


# --------------------------------------------------------------------------- property

_SECTIONS: dict[str, type[BaseModel]] = {
    name: field.annotation  # type: ignore[misc]
    for name, field in TrainConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}
_IDENT = st.from_regex(r"[a-z][a-z0-9_]{0,11}", fullmatch=True)


@st.composite
def unknown_dotted_keys(draw: st.DrawFn) -> tuple[str, str]:
    """(dotted key to set, the dotted prefix that is unknown)."""
    section = draw(st.sampled_from(["", *sorted(_SECTIONS)]))
    known = TrainConfig.model_fields if not section else _SECTIONS[section].model_fields
    name = draw(_IDENT.filter(lambda n: n not in known))
    tail = draw(st.lists(_IDENT, max_size=2))
    unknown = f"{section}.{name}" if section else name
    return ".".join([unknown, *tail]), unknown


@settings(max_examples=40)
@given(unknown_dotted_keys(), st.sampled_from(["1", "true", "x", "[1, 2]", "null"]))
def test_any_key_outside_the_schema_is_a_one_line_config_error(key_and_unknown: tuple[str, str], value: str) -> None:
    key, unknown = key_and_unknown
    with pytest.raises(ConfigError) as info:
        build_config({}, [f"{key}={value}"])
    message = str(info.value)
    assert_one_line(message, "unknown key", "accepted:")
    assert message.startswith(f"{unknown}:")



# --------------------------------------------------------------------------- strict types

def _strict_fields() -> list[tuple[str, str, object]]:
    """(section, field, a string that lax validation would coerce) for every number or switch field
    of every section, the generated ``optimizations`` and the ``tuning`` section included."""
    sections = {"": TrainConfig, **_SECTIONS, "env.atari": _SECTIONS["env"].model_fields["atari"].annotation}
    out = []
    for section, model in sections.items():
        for name, field in model.model_fields.items():
            accepts = _accepted_scalars(field.annotation)
            if "str" in accepts or not accepts & {"int", "float", "bool"}:
                continue
            text = "true" if "bool" in accepts else "1"
            out.append((section, name, text))
    return out


def _nested(section: str, name: str, value: object) -> dict:
    data: dict = {name: value}
    for part in reversed(section.split(".") if section else []):
        data = {part: data}
    return data


@pytest.mark.parametrize(("section", "name", "text"), _strict_fields(),
                         ids=lambda v: v if isinstance(v, str) else None)
def test_no_string_becomes_a_number_or_a_switch(section: str, name: str, text: str) -> None:
    key = f"{section}.{name}" if section else name
    message = config_error([], _nested(section, name, text))
    assert_one_line(message, f"{key}: invalid value {text!r}: expected")
    assert message.startswith(f"{key}:")


def test_strict_type_errors_name_key_value_and_type() -> None:
    assert_one_line(config_error([], {"env": {"num_envs": "16"}}),
                    "env.num_envs: invalid value '16': expected an integer, not a string (write it without quotes)")
    assert_one_line(config_error([], {"ppo": {"anneal_lr": "yes"}}),
                    "ppo.anneal_lr: invalid value 'yes': expected a boolean (true or false), not a string")
    assert_one_line(config_error([], {"stability": {"max_grad_norm": "0.5"}}),
                    "stability.max_grad_norm: invalid value '0.5': expected a number or null, not a string")
    assert_one_line(config_error([], {"optimizations": {"amp": "true"}}),
                    "optimizations.amp: invalid value 'true': expected true, false or 'auto'")
    assert_one_line(config_error([], {"optimizations": {"torch_threads": "2"}}), "optimizations.torch_threads", "'auto'")
    assert_one_line(config_error([], {"optimizations": {"inference_batch_size": "4"}}),
                    "optimizations.inference_batch_size: invalid value '4': expected an integer or null")
    assert_one_line(config_error([], {"model": {"hidden_sizes": ["64", 64]}}), "model.hidden_sizes.0: invalid value '64'")
    assert_one_line(config_error([], {"env": {"num_envs": 16.0}}), "env.num_envs: invalid value 16.0: expected an integer")


def test_strict_types_keep_what_is_meant() -> None:
    """An integer where a float is expected, ``auto``, null and ``--set`` values (read as YAML) all pass."""
    config = build_config({"ppo": {"learning_rate": 1, "gamma": 1}, "stability": {"max_grad_norm": 1},
                           "optimizations": {"amp": "auto", "torch_threads": "auto", "inference_batch_size": None},
                           "tuning": {"noise_block_steps": 64}},
                          ["env.num_envs=16", "ppo.anneal_lr=false", "optimizations.compile_model=auto", "seed=7"])
    assert config.ppo.learning_rate == 1.0 and isinstance(config.ppo.learning_rate, float)
    assert isinstance(config.stability.max_grad_norm, float)
    assert config.env.num_envs == 16 and config.ppo.anneal_lr is False and config.seed == 7
    assert config.optimizations.amp == "auto" and config.optimizations.compile_model == "auto"
