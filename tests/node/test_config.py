"""Node configuration: the TOML file, its validation, and the shipped example."""

from pathlib import Path

import pytest

from node.config import ConfigError, NodeConfig, load_config

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "node.toml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "node.toml"
    path.write_text(text)
    return path


def test_the_shipped_example_is_valid_and_keeps_mdns_off():
    config = load_config(EXAMPLE)
    assert config.mdns is False
    assert config.listen == ("/ip4/0.0.0.0/tcp/4001",)


def test_mdns_defaults_off_and_can_be_switched_on(tmp_path):
    assert NodeConfig().mdns is False
    assert load_config(write(tmp_path, "mdns = true\n")).mdns is True


@pytest.mark.parametrize("value", ['"yes"', "1", "[]"])
def test_mdns_must_be_a_boolean(tmp_path, value):
    with pytest.raises(ConfigError, match="mdns must be true or false"):
        load_config(write(tmp_path, f"mdns = {value}\n"))


def test_a_misspelt_setting_is_an_error_not_a_silent_default(tmp_path):
    with pytest.raises(ConfigError, match="unknown setting.*mnds"):
        load_config(write(tmp_path, "mnds = true\n"))
