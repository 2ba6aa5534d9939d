"""`make doctor`: each check says ok, warn or fix, and names the fix when not ok."""
import pytest

from labutils.bench import doctor

pytestmark = pytest.mark.lab01   # the machine check a class starts with (lab 01 shows the machine)


def test_each_check_names_its_fix_when_the_machine_falls_short():
    assert doctor.check_python(("3", "9", "1")).status == "fix"
    assert doctor.check_python(("3", "11", "7")).status == "ok"
    bad = doctor.check_torch("2.5.1+cpu")
    assert bad.status == "fix" and "make clean && make lab" in bad.fix and "2.13.0" in bad.fix
    assert doctor.check_torch("2.13.0+cpu").status == "ok"
    one = doctor.check_cores(1)
    assert one.status == "warn" and "at least 2 cores" in one.fix
    assert doctor.check_memory(2 * 2**30).status == "warn"
    assert doctor.check_disk(free_bytes=100 * 2**20).status == "warn"
    font = doctor.check_font("")
    assert font.status == "warn" and "fonts-wqy-microhei" in font.fix
    assert doctor.check_font("WenQuanYi Micro Hei,文泉驿微米黑\n").detail == "WenQuanYi Micro Hei"
    assert doctor.check_browser("/nonexistent/chromium").status == "warn"


def test_a_finding_prints_its_fix_only_when_not_ok():
    assert doctor.Finding("x", "ok", "fine", "do y").line() == "[ok] x: fine"
    assert doctor.Finding("x", "fix", "broken", "do y").line() == "[fix] x: broken\n       -> do y"


@pytest.mark.slow
def test_doctor_launches_two_real_ranks_and_exits_zero_on_this_machine(capsys):
    assert doctor.main([]) == 0
    out = capsys.readouterr().out
    assert "[ok] 2-rank launch: gloo all-reduce on 2 ranks" in out
    assert "ready for the labs" in out and "[fix]" not in out
