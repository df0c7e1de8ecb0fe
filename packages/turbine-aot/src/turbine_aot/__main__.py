from turbine_aot._cli import main

raise SystemExit(main())
