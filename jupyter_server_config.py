"""JupyterLab settings for the course (`make lab` and `make course` pass this file with --config).

After a notebook is saved, if git sees no change once the nbstripout filter (`make git-filter`)
has stripped its outputs, refresh git's index entry so that `git status` says so too: git reports
a tracked file whose size changed as modified without running the filter, until its index entry
is refreshed (`git diff` shows nothing meanwhile). A real edit, an untracked file or a checkout
without the filter is left alone. It runs in the background (the filter takes a second or more
on a large notebook), so a save never waits for it or fails because of it.
"""
import os
import subprocess

REFRESH = 'git ls-files --error-unmatch -- "$1" && git diff --quiet -- "$1" && git update-index -q -- "$1"'


def refresh_git_index(model=None, os_path=None, contents_manager=None, **kwargs):
    """The post-save hook: start the refresh of ``os_path``'s index entry and return."""
    if not os_path or not str(os_path).endswith(".ipynb"):
        return None
    folder, name = os.path.split(str(os_path))
    try:
        return subprocess.Popen(["sh", "-c", REFRESH, "refresh", name], cwd=folder or ".",
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        return None


if "get_config" in globals():  # loaded by Jupyter (not when a test reads this file)
    c = get_config()  # noqa: F821
    c.ContentsManager.post_save_hook = refresh_git_index
