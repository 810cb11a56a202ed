from axoplan.cli import main

main()
