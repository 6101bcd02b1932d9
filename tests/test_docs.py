"""The docs' programs run as their pages show them, and print what the pages say.

The convention, for a page that shows a program (``docs/tutorial/index.rst``,
``docs/index.rst`` and ``docs/howto/events.rst``):

* the program is every ``.. code-block:: python`` block with the option
  ``:class: program``, in page order, joined by two blank lines (so each block is one
  or more whole top-level statements; prose goes between blocks);
* each ``.. code-block:: python`` block with the option ``:class: test`` is a pytest
  module that imports the program (saved under its file name) and must pass;
* each ``.. code-block:: console`` block with the option ``:class: program-output`` is
  one run, in page order, in the same directory: a line starting with ``$ `` is a
  command (``python`` is this interpreter; its first argument names the file the
  program is saved as), and the lines after it, up to the next command, are exactly
  what it prints.

The runs happen in an empty temporary directory, so relative database paths land
there, and a run's output is compared line for line with the page.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import msgspec
import pytest

ROOT = Path(__file__).parent.parent
DOCS = ROOT / "docs"
TUTORIAL = DOCS / "tutorial" / "index.rst"
PAGES = [
    TUTORIAL,
    DOCS / "index.rst",
    DOCS / "howto" / "events.rst",
    DOCS / "howto" / "observability.rst",
]

_DIRECTIVE = re.compile(r"^(?P<indent> *)\.\. code-block:: *(?P<language>\S+) *$")
_OPTION = re.compile(r"^:(?P<name>[\w-]+):(?P<value>.*)$")


class Block(msgspec.Struct, frozen=True):
    language: str
    classes: tuple[str, ...]
    body: str


class Command(msgspec.Struct, frozen=True):
    argv: tuple[str, ...]
    output: tuple[str, ...]


def code_blocks(text: str) -> list[Block]:
    """Every ``code-block`` of an reST text: its language, classes and body.

    The body is what the rendered page shows: like docutils, the directive's block
    (its options and its content) is dedented as a whole, so content indented more
    than the options keeps the difference.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        match = _DIRECTIVE.match(lines[i])
        i += 1
        if match is None:
            continue
        indent = len(match["indent"])
        block: list[str] = []
        while i < len(lines) and (
            not lines[i].strip() or len(lines[i]) - len(lines[i].lstrip()) > indent
        ):
            block.append(lines[i])
            i += 1
        block = textwrap.dedent("\n".join(block)).splitlines()
        classes: tuple[str, ...] = ()
        while block and (option := _OPTION.match(block[0])):
            if option["name"] == "class":
                classes = tuple(option["value"].split())
            block.pop(0)
        body = "\n".join(block).strip("\n")
        blocks.append(Block(match["language"], classes, body))
    return blocks


def program_pieces(page: Path) -> list[str]:
    blocks = code_blocks(page.read_text(encoding="utf-8"))
    return [b.body for b in blocks if b.language == "python" and "program" in b.classes]


def program(pieces: list[str]) -> str:
    return "\n\n\n".join(pieces) + "\n"


def runs(page: Path) -> list[list[Command]]:
    """The page's runs: for each output block, its commands and their output."""
    found: list[list[Command]] = []
    for block in code_blocks(page.read_text(encoding="utf-8")):
        if block.language != "console" or "program-output" not in block.classes:
            continue
        commands: list[Command] = []
        for line in block.body.splitlines():
            if line.startswith("$ "):
                commands.append(Command(tuple(shlex.split(line[2:])), ()))
            else:
                assert commands, f"output before any command in {page}: {line!r}"
                last = commands[-1]
                commands[-1] = Command(last.argv, (*last.output, line))
        found.append(commands)
    return found


def file_name(page: Path) -> str:
    """The file the program is saved as: the first command's script."""
    first = runs(page)[0][0].argv
    assert first[0] == "python", f"{page}: the first command runs {first[0]!r}"
    return first[1]


def run(command: Command, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = list(command.argv)
    if argv[0] == "python":
        argv[0] = sys.executable
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=120, cwd=cwd, check=False
    )


def prints_as_shown(command: Command, done: subprocess.CompletedProcess[str]) -> bool:
    return done.returncode == 0 and done.stdout.splitlines() == list(command.output)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(DOCS)) for p in PAGES])
def test_the_program_runs_as_the_page_shows_it(page: Path, tmp_path: Path) -> None:
    pieces = program_pieces(page)
    assert pieces, f"{page} shows no program"
    page_runs = runs(page)
    assert page_runs, f"{page} shows no output"
    (tmp_path / file_name(page)).write_text(program(pieces), encoding="utf-8")
    for commands in page_runs:
        for command in commands:
            done = run(command, tmp_path)
            assert done.returncode == 0, done.stderr
            assert done.stderr == ""
            assert done.stdout.splitlines() == list(command.output), shlex.join(
                command.argv
            )


def test_the_tutorial_s_tests_pass_against_its_program(tmp_path: Path) -> None:
    blocks = code_blocks(TUTORIAL.read_text(encoding="utf-8"))
    tests = [b.body for b in blocks if b.language == "python" and "test" in b.classes]
    assert tests, "the tutorial shows a test"
    (tmp_path / file_name(TUTORIAL)).write_text(
        program(program_pieces(TUTORIAL)), encoding="utf-8"
    )
    for index, body in enumerate(tests):
        (tmp_path / f"test_page_{index}.py").write_text(body, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
         "-o", "trio_mode=true", "-W", "error", "."],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(tests)} passed" in done.stdout


def test_the_tutorial_needs_every_piece_it_shows(tmp_path: Path) -> None:
    # A program that runs without one of its pieces would mean the test above could
    # not notice a piece missing from the page.
    pieces = program_pieces(TUTORIAL)
    first = runs(TUTORIAL)[0][0]
    name = file_name(TUTORIAL)
    assert len(pieces) >= 5
    for index, piece in enumerate(pieces):
        where = tmp_path / f"without-{index}"
        where.mkdir()
        shorter = pieces[:index] + pieces[index + 1 :]
        (where / name).write_text(program(shorter), encoding="utf-8")
        assert not prints_as_shown(first, run(first, where)), (
            f"the tutorial's program prints the same without piece {index}:\n{piece}"
        )


def test_the_tutorial_example_is_the_pages_program() -> None:
    text = TUTORIAL.read_text(encoding="utf-8")
    assert "literalinclude" not in text  # the page shows the program itself
    example = ROOT / "examples" / "tutorial_expenses.py"
    assert example.read_text(encoding="utf-8") == program(program_pieces(TUTORIAL))


def test_code_blocks_are_parsed_with_their_options() -> None:
    text = textwrap.dedent(
        """\
        Intro.

        .. code-block:: python
            :class: program

            x = 1

            y = 2

        Between.

        .. code-block:: console
           :class: program-output

           $ python a.py
           1 2
        After.

        .. code-block:: python
           :class: program

            z = 3
        """
    )
    assert code_blocks(text) == [
        Block("python", ("program",), "x = 1\n\ny = 2"),
        Block("console", ("program-output",), "$ python a.py\n1 2"),
        # content indented more than its options: the page shows it indented
        Block("python", ("program",), " z = 3"),
    ]
