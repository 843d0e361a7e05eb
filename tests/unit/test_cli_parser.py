"""rgt-run's command line without Ansible: one dispatch table, shared options defined once, help in the user's words,
and the completers a shell calls (argcomplete) - hosts of the -i inventory, profile names - fast and never loud."""

import argparse

import pytest

from rgt import cli

SUBCOMMANDS = ["init", "profiles", "pin", "smoke", "probe", "env_check", "train", "status", "watch", "service", "logs",
               "move", "retry", "pull", "teardown", "lifecycle", "runs", "report"]
INTERNALS = ["design.md", "§", "internals.md", "rgt_status", "rgt_gate", "rgt_tree", "teardown_plan_only",
             "module", "rgt.cli", "monitor.yml", "launch_detached.yml"]


def subparsers() -> dict[str, argparse.ArgumentParser]:
    return cli._subparsers(cli.build_parser())


def test_the_dispatch_table_is_the_parser():
    table = cli.commands()
    assert list(table) == SUBCOMMANDS
    assert list(subparsers()) == SUBCOMMANDS
    for name, command in table.items():
        assert command.help and "\n" not in command.help and len(command.help) < 110, name


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_subcommand_help_exits_0_in_the_users_words(name, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: rgt-run {name}")
    for word in INTERNALS:
        assert word not in out, f"`rgt-run {name} --help` says {word!r}:\n{out}"


@pytest.mark.parametrize("name", ["status", "watch", "logs", "pull", "teardown", "lifecycle", "train", "probe", "pin"])
def test_commands_on_boxes_share_one_definition_of_the_target_options(name):
    """-i/-l (and -e, --json, --ledger, -v where taken) read the same on every command that acts on boxes."""
    parser = subparsers()[name]
    by_flag = {flag: action for action in parser._actions for flag in action.option_strings}
    for key, (flags, spec) in cli.SHARED_OPTIONS.items():
        if key not in cli.commands()[name].shared:
            continue
        action = by_flag[flags[0]]
        assert action.help == spec["help"] and action.option_strings == list(flags), (name, key)
    assert by_flag["-i"].required
    assert by_flag["-l"].completer is cli.complete_hosts


def test_bad_arguments_stay_input_errors():
    with pytest.raises(cli.InputError) as refused:
        subparsers()["watch"].parse_args(["-i", "inv", "--interval", "soon"])
    assert "--interval" in refused.value.message and refused.value.field == "argv"


# ---------------------------------------------------------------- completers

def test_inventory_names_reads_yaml_directories_and_ini_files(tmp_path):
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    (inv / "hosts.yml").write_text("all:\n  hosts:\n    box-a: {ansible_host: 10.0.0.1}\n  children:\n"
                                   "    gpus:\n      hosts:\n        box-b:\n        box-c: {}\n")
    (inv / "known_hosts").write_text("box-z ssh-ed25519 AAAA\n")
    (inv / "group_vars" / "all.yml").write_text("never_a_host: 1\n")
    assert cli.inventory_names(inv) == ["box-a", "box-b", "box-c", "gpus"]
    ini = tmp_path / "hosts.ini"
    ini.write_text("# a comment\nsolo ansible_host=1.2.3.4\n[trainers]\nt1 ansible_port=2222\nt2\n"
                   "[trainers:vars]\nrgt_profile=runpod\n[all:children]\ntrainers\n")
    assert cli.inventory_names(ini) == ["solo", "t1", "t2", "trainers"]


def test_host_completion_never_fails_loudly(tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_bytes(b"all: {hosts: [\xff\xfe")
    assert cli.complete_hosts("", argparse.Namespace(inventory=str(broken))) == []
    assert cli.complete_hosts("", argparse.Namespace(inventory=str(tmp_path / "missing"))) == []
    assert cli.complete_hosts("", None) == []


def test_host_completion_completes_the_last_item_of_a_list(tmp_path):
    inv = tmp_path / "hosts.yml"
    inv.write_text("all:\n  hosts:\n    a1: {}\n    a2: {}\n    b1: {}\n")
    ns = argparse.Namespace(inventory=str(inv))
    assert cli.complete_hosts("a", ns) == ["a1", "a2"]
    assert cli.complete_hosts("a1,", ns) == ["a1,a2", "a1,b1"]
    assert cli.complete_hosts("a1,b", ns) == ["a1,b1"]


def test_runs_completes_hosts_from_the_ledger_when_there_is_no_inventory(tmp_path):
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "box-a.json").write_text("{}")
    assert cli.complete_hosts("x", argparse.Namespace(ledger=str(tmp_path))) == []
    assert cli.complete_hosts("", argparse.Namespace(ledger=str(tmp_path))) == ["box-a"]


def test_profile_completion():
    assert cli.complete_profiles("run") == ["runpod"]
    assert "local" in cli.complete_profiles("")


# ---------------------------------------------------------------- where output goes

def test_a_result_goes_to_stdout_and_under_json_to_stderr(capsys):
    """stdout holds the result (or, under --json, only the JSON document: the table then goes to stderr); a console
    that is no terminal is wide enough for every row on one line."""
    import json

    from rgt import output

    try:
        assert cli.main(["profiles"]) == 0
        out, err = capsys.readouterr()
        assert "│ runpod " in out and err == ""
        assert output.results().width == output.WIDE and not output.results().is_terminal
        assert cli.main(["profiles", "--json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out)["command"] == "profiles" and "│ runpod " in err
        assert output.results().stderr  # a command run inside a --json one never prints a result on stdout
    finally:
        output.set_json(False)
