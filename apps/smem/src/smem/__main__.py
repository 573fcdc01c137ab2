from smem.cli import main

raise SystemExit(main())
