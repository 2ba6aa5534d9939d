"""The course map: the README's table of labs is generated from labutils.course.LABS."""
import json
import os
import re
from pathlib import Path

import pytest

from labutils import course

pytestmark = pytest.mark.lab01


def test_readme_table_is_current():
    with open(os.path.join(course.ROOT, "README.md")) as f:
        section = course.readme_section(f.read())
    assert section == course.markdown_table(), "run: .venv/bin/python -m labutils.course"


def test_every_notebook_is_on_the_map():
    on_disk = {f[:-6] for f in os.listdir(os.path.join(course.ROOT, "notebooks"))
               if f.endswith(".ipynb")}
    assert on_disk <= {lab.notebook for lab in course.LABS}


@pytest.mark.parametrize("lab", [lab for lab in course.LABS if lab.exists],
                         ids=lambda lab: lab.notebook)
def test_notebook_opens_with_its_chapter_and_objectives(lab):
    with open(lab.path) as f:
        cells = json.load(f)["cells"]
    first = "".join(cells[0]["source"])
    assert first.startswith("# "), "the first cell is the lab's title"
    assert any("\u4e00" <= ch <= "\u9fff" for ch in first), "Chinese chapter title beside English"
    text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    text = text.lower()
    assert "objectives" in text, "learning objectives"
    assert "summary" in text and "exercise" in text, "a summary and exercises at the end"


@pytest.mark.parametrize("lab", [lab for lab in course.LABS if lab.exists],
                         ids=lambda lab: lab.notebook)
def test_notebook_stores_the_installed_kernelspec(lab):
    """JupyterLab rewrites a notebook's kernelspec to the running kernel's on open; if they
    differ, the notebook shows as modified before anyone touched it."""
    from jupyter_client.kernelspec import KernelSpecManager
    spec = KernelSpecManager().get_kernel_spec("python3")
    with open(lab.path) as f:
        stored = json.load(f)["metadata"]["kernelspec"]
    assert stored == {"display_name": spec.display_name, "language": spec.language,
                      "name": "python3"}


def test_the_chinese_map_covers_every_lab_and_nothing_else():
    import polib
    from labutils.core import i18n
    # keyed by the English text: an English edit fails here until the Chinese follows it
    catalog = polib.pofile(str(Path(course.__file__).parent / "locale" / "zh.po"))
    entries = {e.msgid for e in catalog if e.msgctxt == course.COURSE and e.translated()}
    texts = ({lab.shows for lab in course.LABS} | {lab.device for lab in course.LABS}
             | {lab.chapter for lab in course.LABS})
    assert entries == texts | set(course.HEADER) | {course.COMING}

    def zh(text):
        return i18n.translate(text, "zh", context=course.COURSE)
    english, chinese = (course.markdown_table(language=x).splitlines() for x in ("en", "zh"))
    assert len(chinese) == len(english) == len(course.LABS) + 2
    for en_row, zh_row, lab in zip(english[2:], chinese[2:], course.LABS):
        en_cells, zh_cells = en_row.split(" | "), zh_row.split(" | ")
        assert zh_cells[1:3] == en_cells[1:3]        # link, modules: the same
        # the chapter: the article's own Chinese heading, its number first, no English words
        # (names such as PyTorch, DDP, GPipe, 1F1B, ZeRO, FSDP2, SGD stay as they are)
        chapter, number = zh_cells[0].lstrip("| "), lab.chapter.split()[0]
        assert chapter == zh(lab.chapter) != lab.chapter
        assert chapter.startswith(number + " ") or not number[0].isdigit(), chapter
        assert not re.search(r"\b[a-z]{3,}\b", chapter), chapter
        assert lab.shows in en_row and zh(lab.shows) in zh_row
        assert any("\u4e00" <= ch <= "\u9fff" for ch in zh_cells[3]), lab.notebook


def test_the_map_in_an_unknown_language_names_the_choices():
    with pytest.raises(ValueError, match=r"'fr'.*'en', 'zh'"):
        course.markdown_table(language="fr")


# The labs that keep the class budget (one class slot of 45 minutes): the rest follow as their
# issues land. A lab opens with its central question and a lesson plan, a table of sections
# and minutes; its markdown stays within 1,400 words (whitespace-separated, code spans
# included) and it has at most 3 exercises (checker sections plus "More to try" items).
CLASS_SIZED = ("01", "02", "03a1", "03a2", "03b", "03c", "03d", "03e1", "03e2",
               "04a", "04b", "04c1", "04c2", "05", "06a1", "06a2", "06b", "06c1", "06c2", "06d1", "06d2", "06d3", "06e", "07")
MAX_WORDS, MAX_MINUTES, MAX_EXERCISES = 1400, 45, 3


def lesson_plan(first_cell):
    """The minutes of each row of the lesson-plan table in a lab's first cell."""
    import re
    assert "**Central question.**" in first_cell and "?" in first_cell, \
        "the first cell states the lab's central question: '**Central question.** ...?'"
    assert "**Lesson plan**" in first_cell, "the first cell has '**Lesson plan**' and its table"
    plan = first_cell.split("**Lesson plan**", 1)[1]
    rows = [line for line in plan.splitlines() if line.startswith("|")][2:]   # past the header
    minutes = [re.fullmatch(r"\s*(\d+)\s*", row.strip("|").split("|")[-1]) for row in rows]
    assert rows and all(minutes), "each lesson-plan row ends in its minutes: | section | 10 |"
    return [int(m.group(1)) for m in minutes]


def exercise_count(cells):
    import re
    count = 0
    for cell in cells:
        text = "".join(cell["source"])
        if cell["cell_type"] != "markdown":
            continue
        count += len(re.findall(r"^## Exercise", text, flags=re.M))
        if "More to try" in text:
            tried = text.split("More to try", 1)[1].split("\n## ", 1)[0]
            count += len(re.findall(r"^\d+\. ", tried, flags=re.M))
    return count


@pytest.mark.parametrize("lab", [lab for lab in course.LABS if lab.code in CLASS_SIZED],
                         ids=lambda lab: lab.notebook)
def test_a_lab_fits_one_class(lab):
    with open(lab.path) as f:
        cells = json.load(f)["cells"]
    minutes = lesson_plan("".join(cells[0]["source"]))
    assert sum(minutes) <= MAX_MINUTES, f"lesson plan {minutes}: {sum(minutes)} > 45 minutes"
    words = sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    assert words <= MAX_WORDS, f"{words} markdown words; a class reads at most {MAX_WORDS}"
    assert exercise_count(cells) <= MAX_EXERCISES, "at most 3 exercises: split rather than cram"


def test_the_map_a_notebook_shows_leaves_out_the_developers_columns():
    """01 shows the map on a projector: no labutils or CPU/GPU column (the README keeps them)."""
    for language in ("en", "zh"):
        header = course.markdown_table(link_prefix="", language=language,
                                       columns=course.STUDENT_COLUMNS).splitlines()[0]
        assert header.count("|") == len(course.STUDENT_COLUMNS) + 1
        assert "labutils" not in header and "`" not in course.markdown_table(
            columns=course.STUDENT_COLUMNS)
    assert set(course.STUDENT_COLUMNS) < set(course.HEADER)
