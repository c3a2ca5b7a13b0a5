"""openforge.sandbox.bounded: what the trusted side reads of the agent's files and output is
bounded, and says what it left out."""

from __future__ import annotations

from pathlib import Path

from openforge.sandbox import bounded


def test_a_file_within_the_limit_is_read_whole_and_a_larger_one_cut_with_a_note(
        tmp_path: Path) -> None:
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text("42\n")
    large.write_bytes(b"42\n" + b" " * 5000)
    assert bounded.read_text(small, 3) == "42\n"
    cut = bounded.read_text(large, 100)
    assert cut.startswith("42\n" + " " * 97)
    assert cut.endswith("\n[openforge: 4,903 bytes of large.txt not read: past what the "
                        "trusted side reads]\n")
    assert cut.strip() != "42"  # whitespace past the limit cannot make it match


def test_the_tail_of_a_file(tmp_path: Path) -> None:
    path = tmp_path / "err"
    path.write_bytes(b"a" * 1000 + b"the end")
    assert bounded.tail(path, 7) == "the end"
    assert bounded.tail(path, 10_000) == "a" * 1000 + "the end"
    assert bounded.tail(tmp_path / "missing", 10) == ""


def test_an_output_longer_than_twice_the_kept_bytes_keeps_its_head_and_tail(
        tmp_path: Path) -> None:
    path = tmp_path / "out"
    path.write_bytes(b"FIRST" + b"x" * 10_000 + b"LAST")
    text, omitted = bounded.head_and_tail(path, keep=100)
    assert omitted == 10_009 - 200
    assert text.startswith("FIRST" + "x" * 95) and text.endswith("x" * 96 + "LAST")
    assert "[openforge: 9,809 bytes of out not read" in text
    path.write_bytes(b"FIRST" + b"x" * 190 + b"LAST")  # 199 bytes: whole
    assert bounded.head_and_tail(path, keep=100) == ("FIRST" + "x" * 190 + "LAST", 0)
    assert bounded.head_and_tail(tmp_path / "missing") == ("", 0)


def test_result_lines_in_the_agents_output_are_read_at_most_64_kib_each(tmp_path: Path) -> None:
    """The forgery check reads the harness's output, which the agent can write into: a line
    of any length costs it at most 64 KiB, and only a line's start can be a result line."""
    from openforge.sandbox import forgery
    from openforge.sandbox.protocol import RESULT_PREFIX

    prefix = RESULT_PREFIX.encode()
    path = tmp_path / "harness.stdout"
    path.write_bytes(prefix + b"x" * (200 << 10) + b"\n"  # a forged line, 200 KiB long
                     + b"y" * (64 << 10) + prefix + b"inside a line\n"  # at a read's start
                     + prefix + b"another\n")
    [(name, lines)] = forgery.in_files([path])
    assert name == "harness.stdout"
    assert [len(line) for line in lines] == [64 << 10, len(RESULT_PREFIX) + len("another")]
    assert lines[0].startswith(RESULT_PREFIX + "xxx") and lines[1] == RESULT_PREFIX + "another"


def test_of_a_million_forged_lines_the_first_thousand_are_kept(tmp_path: Path) -> None:
    from openforge.sandbox import forgery
    from openforge.sandbox.protocol import RESULT_PREFIX

    path = tmp_path / "harness.stderr"
    path.write_bytes((RESULT_PREFIX + "x\n").encode() * 1_000_000)
    [(_, lines)] = forgery.in_files([path])
    assert len(lines) == 1000 and set(lines) == {RESULT_PREFIX + "x"}


def test_a_command_runs_into_files_that_go_with_the_block(tmp_path: Path) -> None:
    with bounded.run_to_files(["sh", "-c", "cat; echo oops >&2; pwd; exit 3"], timeout_s=30,
                              cwd=tmp_path, stdin="fed\n") as ran:
        assert ran.returncode == 3
        assert ran.stdout.read_text() == f"fed\n{tmp_path}\n"
        assert ran.stderr.read_text() == "oops\n"
        folder = ran.stdout.parent
    assert not folder.exists()


def test_a_command_past_its_time_has_no_exit_status() -> None:
    with bounded.run_to_files(["sleep", "30"], timeout_s=0.2) as ran:
        assert ran.returncode is None
