"""The student landing pages of the course site (``index.md``, ``index.zh.md``), generated:
what the course is, how to start (`make lab`), and the labs in course order
(labutils/course.py LABS), each with its title and central question from the first cell of
its notebook (the Chinese page from the Chinese notebooks, the English question where the
Chinese cell has none yet). Not the developer README."""
from __future__ import annotations

from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
LABEL = {"en": "**Central question.**", "zh": "**核心问题。**"}


def first_cell(path: Path) -> str:
    cells = nbformat.read(path, as_version=4).cells
    return cells[0].source if cells else ""


def title_of(first: str, fallback: str) -> str:
    return next((line[2:].strip() for line in first.splitlines() if line.startswith("# ")),
                fallback)


def central_question(first: str) -> str | None:
    """The text after '**Central question.**' (or its Chinese label), up to the paragraph's end."""
    for label in LABEL.values():
        at = first.find(label)
        if at >= 0:
            return " ".join(first[at + len(label):].split("\n\n")[0].split())
    return None


INTRO = {
    "en": """# PyTorch distributed training and model parallelism, hands-on

A course in {count} labs. Each lab is a Jupyter notebook that starts real processes (ranks)
from a cell, builds one technique of distributed training from scratch (ring all-reduce, DDP,
pipeline, tensor and sharded parallelism), checks it equal to one process and to PyTorch's own
version, and measures it, on an ordinary laptop's CPU. A lab fits one class and answers one
central question with an experiment you run.

## How to start

1. In the course's folder, run `make lab`. The first time it installs what the labs need (a few
   minutes); then it prints a link to JupyterLab on this computer: open it.
2. Start with lab 01. You work in your own copies (the folder `my-labs/`): running, editing and
   saving them never changes the course. `make reset LAB=01_introduction` restores one copy.
3. Run the cells from the top (Shift+Enter). Knob panels change an experiment and run it again;
   on this site they show the stored run only.

## The labs, in order
""",
    "zh": """# PyTorch 分布式训练与模型并行化实践

本课程共 {count} 个实验。每个实验是一个 Jupyter 笔记本：从一个单元启动真实的进程（rank），从零实现
分布式训练的一种技术（环形全归约、DDP、流水线并行、张量并行、分片并行），检查它与单进程结果以及
PyTorch 自带实现一致，并在普通笔记本电脑的 CPU 上测量它。每个实验一节课可以完成，用一个你亲手运行的
实验回答一个核心问题。

## 怎样开始

1. 在课程目录中运行 `make lab EDITION=zh`。第一次运行会安装实验所需的软件（几分钟），然后打印本机
   JupyterLab 的链接：打开它。
2. 从实验 01 开始。你在自己的副本（`my-labs/zh/` 文件夹）中练习：运行、修改和保存都不会改动课程本身。
   `make reset EDITION=zh LAB=01_introduction` 恢复一个副本。
3. 从头依次运行单元（Shift+Enter）。控制面板可以改变实验参数并重新运行；本网站只显示保存的运行结果。

## 实验（按顺序）
""",
}
TEACHERS = {
    "en": "\n## For teachers\n\nEach lab has a page in the [teacher's guide]({guide}) (lesson "
          "plan, what to project, results to expect, discussion questions, exercise solutions) "
          "and a printable [handout]({handout}). To project a lab at 1,024 px, close "
          "JupyterLab's file browser (Ctrl+B): every figure then fits the 844 px output area "
          "at its own size, ticks and legends at 10 pt; the RISE button in the notebook's "
          "toolbar presents the lab as slides.\n",
    "zh": "\n## 教师\n\n每个实验在[教师指南]({guide})中有一页（课程安排、投影内容、预期结果、讨论题、"
          "练习答案），并有可打印的[讲义]({handout})。在 1024 像素的投影上讲课时，按 Ctrl+B 收起 "
          "JupyterLab 的文件浏览器：每张图都能按原尺寸放进 844 像素宽的输出区，刻度和图例为 10 磅；笔记本"
          "工具栏上的 RISE 按钮把实验放成幻灯片。\n",
}


def landing(labs, lang: str) -> str:
    """The landing page of one edition: what the course is, how to start, the labs in order
    with each one's central question (the Chinese one where the Chinese cell has it)."""
    lines = [INTRO[lang].format(count=len(labs))]
    for number, lab in enumerate(labs, 1):
        english = first_cell(ROOT / "notebooks" / f"{lab.notebook}.ipynb")
        own = english if lang == "en" else first_cell(
            ROOT / "notebooks" / "zh" / f"{lab.notebook}.ipynb")
        title = title_of(own, lab.notebook)
        question = central_question(own) or central_question(english) or ""
        lines.append(f"{number}. [{title}](notebooks/{lab.notebook}.ipynb)  \n   {question}")
    guides = [lab for lab in labs if (ROOT / "guide" / f"{lab.notebook}.md").exists()]
    if guides:
        lines.append(TEACHERS[lang].format(guide=f"guide/{guides[0].notebook}.md",
                                           handout=f"handouts/{labs[0].notebook}.md"))
    return "\n".join(lines) + "\n"
