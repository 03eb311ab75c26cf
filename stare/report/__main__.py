from stare.report import main

main()
