from ddpdeploy.cli import main

main()
