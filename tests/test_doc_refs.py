"""scripts/check-doc-refs.py (make lint): a path, playbook or tag the docs name that does not exist fails."""

from __future__ import annotations

import subprocess
import sys

from conftest import ROOT

SCRIPT = ROOT / "scripts/check-doc-refs.py"


def run(*docs):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, docs)], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=False)


def test_the_shipped_docs_name_only_what_exists():
    done = run()
    assert done.returncode == 0, done.stdout


def test_a_stale_path_playbook_and_tag_are_each_named(tmp_path):
    doc = ROOT / "docs" / ("zz-%s.md" % tmp_path.name)      # beside the docs, so relative links resolve as theirs
    doc.write_text("Run `ansible-playbook -i inventory/mysite playbooks/gone.yml --tags host,nosuch`.\n"
                   "See [the role](../roles/vca_host/README.md), [a gone one](../roles/gone/README.md),\n"
                   "`roles/vca_host/tasks/main.yml:3`, `inventory/mysite/hosts.yml`, `/etc/vca_config.d`.\n")
    try:
        done = run(doc)
    finally:
        doc.unlink()
    lines = done.stdout.splitlines()
    assert done.returncode == 1
    assert "%s:1: no playbook playbooks/gone.yml" % doc.relative_to(ROOT) in lines
    assert "%s:1: no tag nosuch in site.yml, playbooks/ or roles/" % doc.relative_to(ROOT) in lines
    assert "%s:2: no roles/gone/README.md in the repository" % doc.relative_to(ROOT) in lines
    assert lines[-1] == "1 documents: 4 stale references", lines      # nothing else: the rest exists or is not ours


def test_an_issue_number_and_a_run_on_the_template_are_each_named(tmp_path):
    """No tracker ships with the repository, and the owner runs their copy of the template; the
    template's own page (playbooks/exposure.yml --tags doc) is the one command that runs on it."""
    doc = ROOT / "apps" / "farm" / ("zz-%s.md" % tmp_path.name)     # an app's README's place: its own paths
    doc.write_text("As in issue 14, run `ansible-playbook -i inventory/production site.yml`.\n"
                   "`ansible-playbook -i inventory/production playbooks/exposure.yml --tags doc` is fine.\n"
                   "`tests/test_lease_calls.py` (the app's), `chainsx/intel-vca2-dkms:apps/vcactl.cpp` (another's).\n"
                   "Read `/work/shared/data.json`.\n")
    try:
        done = run(doc)
    finally:
        doc.unlink()
    lines = done.stdout.splitlines()
    where = doc.relative_to(ROOT)
    assert done.returncode == 1
    assert "%s:1: cites 'issue 14', and no issue tracker comes with the repository: say what it was " \
        "(a commit, a date)" % where in lines
    assert "%s:1: runs against inventory/production, the template: your copy (-i inventory/mysite) is meant" \
        % where in lines
    assert "%s:4: names /work/shared/data.json, a path on the machine this was written on" % where in lines
    assert lines[-1] == "1 documents: 3 stale references", lines
