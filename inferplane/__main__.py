from inferplane.cli.main import main

main()
