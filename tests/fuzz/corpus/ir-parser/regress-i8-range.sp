graph @g {
  const %c : i8[] = dense<300>
  output "o" = %c
}
