from turbine_aot._cli.main import main

raise SystemExit(main())
