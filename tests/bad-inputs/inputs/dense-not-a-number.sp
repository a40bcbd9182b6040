graph @g {
  const %c : f32[2] = dense<[1.0, abc]>
  output "y" = %c
}
