"""The Spark jobs' settings (``audit/jobs/settings.py``): declared once, each a flag and a key of
``--config``'s ``[job]`` table, a flag given winning over the file, checked before Spark starts
(exit 78 with the key's path), the file's ``[kafka]`` table taken as the sign-in."""

from __future__ import annotations

from pathlib import Path

import pytest

from audit import cli
from audit.jobs.settings import JOB_SETTINGS, flag_of, job_values
from docket_common.settings import ConfigError


def values(*argv: str, command: str = "count"):
    args = cli._parser().parse_args([command, "--cluster", "c", *argv] if command == "count"
                                    else [command, "--warehouse", "w", *argv])
    return job_values(args)


def test_flags_alone_give_the_declared_defaults():
    v, security = values("--bootstrap-servers", "127.0.0.1:9092")
    assert security is None
    assert v == {s.key: s.default for s in JOB_SETTINGS} | \
        {"job.bootstrap_servers": "127.0.0.1:9092"}
    assert v["job.window_ms"] == 600_000 and v["job.identity"] is True


def test_every_setting_is_a_flag_of_both_jobs():
    for command in ("count", "land"):
        sub = cli._parser()._subparsers._group_actions[0].choices[command]
        flags = {o for a in sub._actions for o in a.option_strings}
        assert {flag_of(s) for s in JOB_SETTINGS} | {"--config"} <= flags


def test_the_file_gives_what_the_flags_do_not(tmp_path: Path):
    conf = tmp_path / "job.toml"
    conf.write_text('[job]\nbootstrap_servers = "h:1"\nwindow_ms = 60000\ntrigger_s = 5\n'
                    'identity = false\nkafka_options = ["fetch.max.bytes=1048576"]\n')
    v, _ = values("--config", str(conf), "--window-ms", "120000", "--once")
    assert (v["job.bootstrap_servers"], v["job.window_ms"], v["job.trigger_s"]) == \
        ("h:1", 120_000, 5.0)
    assert v["job.once"] is True and v["job.identity"] is False
    assert v["job.kafka_options"] == ["fetch.max.bytes=1048576"]
    v, _ = values("--config", str(conf), "--kafka-option", "a=b", command="land")
    assert v["job.kafka_options"] == ["a=b"]             # a flag given replaces the file's list


@pytest.mark.parametrize("text,argv,path", [
    ('[job]\nwindow_msec = 60000\nbootstrap_servers = "h:1"\n', [], "job.window_msec"),
    ('[job]\nwindow_ms = "10m"\nbootstrap_servers = "h:1"\n', [], "job.window_ms"),
    ('[job]\nwindow_ms = 500\n', ["--bootstrap-servers", "h:1"], "job.window_ms"),
    ('[job]\ntopics = "app(.*"\n', ["--bootstrap-servers", "h:1"], "job.topics"),
    ('[job]\ntrigger_s = 0\n', ["--bootstrap-servers", "h:1"], "job.trigger_s"),
    ('[job]\naudit_topic = "no spaces"\n', ["--bootstrap-servers", "h:1"], "job.audit_topic"),
    ('[job]\nonce = true\n', [], "job.bootstrap_servers"),
    ('[jobs]\nonce = true\n', ["--bootstrap-servers", "h:1"], "jobs"),
    ('job = 3\n', ["--bootstrap-servers", "h:1"], "job"),
    ('[job]\ntrigger_s = nan\n', ["--bootstrap-servers", "h:1"], "job.trigger_s"),
    ('[job]\nmax_offsets_per_trigger = -1\n', ["--bootstrap-servers", "h:1"],
     "job.max_offsets_per_trigger"),
    ('[job]\nkafka_config = "k.toml"\n[kafka]\nsecurity_protocol = "plaintext"\n',
     ["--bootstrap-servers", "h:1"], "kafka"),
])
def test_a_bad_setting_names_its_key(tmp_path: Path, text, argv, path):
    conf = tmp_path / "job.toml"
    conf.write_text(text)
    with pytest.raises(ConfigError) as caught:
        values("--config", str(conf), *argv)
    assert caught.value.path == path


def test_a_bad_setting_stops_the_job_with_exit_78_before_spark(tmp_path: Path, capsys):
    conf = tmp_path / "job.toml"
    conf.write_text("[job]\nwindow_msec = 60000\n")
    assert cli.main(["count", "--cluster", "c", "--config", str(conf)]) == 78
    err = capsys.readouterr().err
    assert "job.window_msec" in err and "did you mean 'window_ms'" in err


def _job_and_kafka_file(tmp_path: Path) -> Path:
    """A job's file with its [kafka] sign-in (SCRAM over TLS, the password in a file)."""
    password, ca = tmp_path / "pw", tmp_path / "ca.pem"
    password.write_text("secret\n")
    password.chmod(0o600)
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    conf = tmp_path / "job.toml"
    conf.write_text(f'[job]\nbootstrap_servers = "h:1"\n\n[kafka]\nsecurity_protocol = '
                    f'"sasl_ssl"\nsasl_username = "count"\nsasl_password_file = "{password}"\n'
                    f'ssl_ca_file = "{ca}"\n')
    return conf


def test_the_files_kafka_table_is_the_sign_in(tmp_path: Path):
    conf = _job_and_kafka_file(tmp_path)
    _v, security = values("--config", str(conf))
    assert security is not None and security.secured
    assert security.librdkafka_properties()["sasl.username"] == "count"


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path, capsys):
    conf = tmp_path / "job.toml"
    conf.write_bytes(b"[job]\nmaster = \"\xff\xfe\"\n")
    assert cli.main(["count", "--cluster", "c", "--config", str(conf)]) == 78
    assert "not UTF-8" in capsys.readouterr().err


def test_paths_in_the_file_are_taken_from_its_folder_flags_from_where_it_runs(tmp_path: Path):
    (tmp_path / "conf").mkdir()
    conf = tmp_path / "conf" / "job.toml"
    conf.write_text('[job]\nbootstrap_servers = "h:1"\ncheckpoint_dir = "ckpt"\n'
                    "max_offsets_per_trigger = 0\n")
    v, _ = values("--config", str(conf))
    assert v["job.checkpoint_dir"] == str(tmp_path / "conf" / "ckpt")
    assert v["job.max_offsets_per_trigger"] == 0          # 0: no limit, as before
    v, _ = values("--config", str(conf), "--checkpoint-dir", "here")
    assert v["job.checkpoint_dir"] == "here"


def test_one_file_may_be_both_the_jobs_and_its_kafka_config(tmp_path: Path):
    conf = _job_and_kafka_file(tmp_path)
    _v, security = values("--kafka-config", str(conf), "--bootstrap-servers", "h:1")
    assert security is not None and security.secured
