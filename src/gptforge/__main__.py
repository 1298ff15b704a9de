from gptforge.cli import main

raise SystemExit(main())
