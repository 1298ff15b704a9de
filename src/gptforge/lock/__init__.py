"""Lock files: pixi.lock v7 and the per-environment exports, solved from recorded public records.

    manifest   what pixi.toml asks for, environment by environment
    store      the conda records the solver may use (envs/records/), each with its public source
    solve      the conda part: pixi's solver (resolvo, through py-rattler) over the record store
    pypi       the PyPI part: uv's resolution, the registry's sha256 and wheel metadata
    pixilock   reading and writing pixi.lock v7
    exports    envs/<env>/conda-lock.yml, requirements.txt, environment.yml, virtual-packages.yml
    build      all of the above, in order; check: the lock against the manifest by pixi's rules
"""
