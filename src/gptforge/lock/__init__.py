"""Lock files: pixi.lock v7 and the per-environment exports, checked against pixi.toml.

    manifest   what pixi.toml asks for, environment by environment
    store      the recorded public conda records (envs/records/) a lock may use
    lockfile   reading pixi.lock (formats 4 to 7) as pixi's rules see it
    exports    envs/<env>/conda-lock.yml, requirements.txt, environment.yml, virtual-packages.yml
    check      `gptforge lock check`: pixi's satisfiability rules (satisfy*.py, workspace.py,
               pypi_metadata.py), the record store and the compatibility engine
    online     every PyPI sha256 against its registry

Writing a lock (the offline solver over the record store) is the maintainers' task: tasks/lockgen/.
"""
