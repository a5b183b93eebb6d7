"""``make test``'s group runner: the end of its output names the tests that failed."""

from tests import run_groups


def test_failures_are_the_short_summary_lines_of_a_group(tmp_path):
    log = tmp_path / "audit.log"
    log.write_text(
        "tests/integration/test_clock_skew.py F\n"
        "E   AssertionError: lost\n"
        "=========================== short test summary info ============================\n"
        "FAILED tests/integration/test_clock_skew.py::test_a - AssertionError: lost\n"
        "ERROR tests/integration/test_mirror.py::test_b - RuntimeError: no broker\n"
        "=========== 1 failed, 1 error, 66 passed in 1498.92s (0:24:58) ===========\n")
    assert run_groups._failures(log) == [
        "FAILED tests/integration/test_clock_skew.py::test_a - AssertionError: lost",
        "ERROR tests/integration/test_mirror.py::test_b - RuntimeError: no broker",
    ]
    assert run_groups._summary(log) == "1 failed, 1 error, 66 passed in 1498.92s (0:24:58)"


def test_the_end_also_says_where_a_test_failed_and_who_held_a_locked_database(tmp_path):
    log = tmp_path / "agent.log"
    log.write_text(
        "    def test_x(tmp_path):\n"
        ">       agent.turn()\n"
        "\n"
        "tests/unit/test_x.py:12: \n"
        "agent/state/db.py:301: in update\n"
        "E   sqlite3.OperationalError: database is locked\n"
        "\n"
        "agent/state/db.py:301: OperationalError\n"
        "------------------------- sqlite lock diagnosis --------------------------\n"
        "sqlite lock diagnosis: the call took 60.2 s | state.db (inode 7): fds here ['9']\n"
        "=========================== short test summary info ============================\n"
        "FAILED tests/unit/test_x.py::test_x - sqlite3.OperationalError: database is locked\n"
        "=========== 1 failed, 3 passed in 70.00s (0:01:10) ===========\n")
    assert run_groups._failures(log) == [
        "FAILED tests/unit/test_x.py::test_x - sqlite3.OperationalError: database is locked",
        "at agent/state/db.py:301: OperationalError",
        "sqlite lock diagnosis: the call took 60.2 s | state.db (inode 7): fds here ['9']",
    ]


def test_a_passing_group_names_no_failure(tmp_path):
    log = tmp_path / "agent.log"
    log.write_text("tests/unit/test_x.py ....\n===== 4 passed in 1.00s =====\n")
    assert run_groups._failures(log) == []


def test_the_soak_splits_the_pause_matrix_from_the_rest_and_selects_everything_marked():
    pause, rest = run_groups.SOAK_GROUPS["pause"], run_groups.SOAK_GROUPS["soak"]
    assert pause[pause.index("-k") + 1] == "pause_matrix"
    assert rest[rest.index("-k") + 1] == "not pause_matrix"
    assert all(g[g.index("-m") + 1] == "soak" for g in (pause, rest))
    assert run_groups.SOAK_NICE == {"soak": 19}
